"""API handlers, one module per Kafka API family; ``HANDLERS`` maps each API key to its handler."""

from __future__ import annotations

from strom.broker.dispatcher import Handler
from strom.broker.handlers.api_versions import handle_api_versions
from strom.broker.handlers.configs import (
    handle_alter_configs,
    handle_describe_configs,
    handle_incremental_alter_configs,
)
from strom.broker.handlers.coordinator import handle_find_coordinator
from strom.broker.handlers.delete_records import handle_delete_records
from strom.broker.handlers.describe_cluster import handle_describe_cluster
from strom.broker.handlers.describe_topic_partitions import handle_describe_topic_partitions
from strom.broker.handlers.elect_leaders import handle_elect_leaders
from strom.broker.handlers.fetch import handle_fetch
from strom.broker.handlers.groups import (
    handle_delete_groups,
    handle_describe_groups,
    handle_heartbeat,
    handle_join_group,
    handle_leave_group,
    handle_list_groups,
    handle_sync_group,
)
from strom.broker.handlers.leader_epoch import handle_offset_for_leader_epoch
from strom.broker.handlers.list_config_resources import handle_list_config_resources
from strom.broker.handlers.list_offsets import handle_list_offsets
from strom.broker.handlers.log_dirs import handle_describe_log_dirs
from strom.broker.handlers.metadata import handle_metadata
from strom.broker.handlers.offsets import (
    handle_offset_commit,
    handle_offset_delete,
    handle_offset_fetch,
    handle_txn_offset_commit,
)
from strom.broker.handlers.produce import handle_produce
from strom.broker.handlers.producer_id import handle_init_producer_id
from strom.broker.handlers.reassignments import (
    handle_alter_partition_reassignments,
    handle_list_partition_reassignments,
)
from strom.broker.handlers.replica_log_dirs import handle_alter_replica_log_dirs
from strom.broker.handlers.topics import handle_create_partitions, handle_create_topics, handle_delete_topics
from strom.broker.handlers.transactions import (
    handle_add_offsets_to_txn,
    handle_add_partitions_to_txn,
    handle_describe_producers,
    handle_describe_transactions,
    handle_end_txn,
    handle_list_transactions,
    handle_write_txn_markers,
)
from strom.protocol.apis import ApiKey

HANDLERS: dict[ApiKey, Handler] = {
    ApiKey.PRODUCE: handle_produce,
    ApiKey.FETCH: handle_fetch,
    ApiKey.LIST_OFFSETS: handle_list_offsets,
    ApiKey.METADATA: handle_metadata,
    ApiKey.OFFSET_COMMIT: handle_offset_commit,
    ApiKey.OFFSET_FETCH: handle_offset_fetch,
    ApiKey.FIND_COORDINATOR: handle_find_coordinator,
    ApiKey.JOIN_GROUP: handle_join_group,
    ApiKey.HEARTBEAT: handle_heartbeat,
    ApiKey.LEAVE_GROUP: handle_leave_group,
    ApiKey.SYNC_GROUP: handle_sync_group,
    ApiKey.DESCRIBE_GROUPS: handle_describe_groups,
    ApiKey.LIST_GROUPS: handle_list_groups,
    ApiKey.API_VERSIONS: handle_api_versions,
    ApiKey.CREATE_TOPICS: handle_create_topics,
    ApiKey.DELETE_TOPICS: handle_delete_topics,
    ApiKey.DELETE_RECORDS: handle_delete_records,
    ApiKey.INIT_PRODUCER_ID: handle_init_producer_id,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: handle_offset_for_leader_epoch,
    ApiKey.ADD_PARTITIONS_TO_TXN: handle_add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: handle_add_offsets_to_txn,
    ApiKey.END_TXN: handle_end_txn,
    ApiKey.TXN_OFFSET_COMMIT: handle_txn_offset_commit,
    ApiKey.WRITE_TXN_MARKERS: handle_write_txn_markers,
    ApiKey.DESCRIBE_PRODUCERS: handle_describe_producers,
    ApiKey.DESCRIBE_TRANSACTIONS: handle_describe_transactions,
    ApiKey.LIST_TRANSACTIONS: handle_list_transactions,
    ApiKey.DESCRIBE_CONFIGS: handle_describe_configs,
    ApiKey.ALTER_CONFIGS: handle_alter_configs,
    ApiKey.DESCRIBE_LOG_DIRS: handle_describe_log_dirs,
    ApiKey.CREATE_PARTITIONS: handle_create_partitions,
    ApiKey.DELETE_GROUPS: handle_delete_groups,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: handle_incremental_alter_configs,
    ApiKey.OFFSET_DELETE: handle_offset_delete,
    ApiKey.DESCRIBE_CLUSTER: handle_describe_cluster,
    ApiKey.LIST_CONFIG_RESOURCES: handle_list_config_resources,
    ApiKey.DESCRIBE_TOPIC_PARTITIONS: handle_describe_topic_partitions,
    ApiKey.ALTER_REPLICA_LOG_DIRS: handle_alter_replica_log_dirs,
    ApiKey.ELECT_LEADERS: handle_elect_leaders,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: handle_alter_partition_reassignments,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: handle_list_partition_reassignments,
}
