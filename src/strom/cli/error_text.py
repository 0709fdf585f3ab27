"""A sentence for each of Kafka's error codes, so that a failed command says what went wrong and,
where there is one, what to do: ``NON_EMPTY_GROUP: the group still has active members; ...``."""

from __future__ import annotations

from strom.client.errors import ErrorCode, KafkaException

E = ErrorCode

SENTENCES: dict[ErrorCode, str] = {
    E.unknown_server_error: "the broker failed in a way it could not name; its log says more",
    E.offset_out_of_range: "the offset asked for is outside the partition's log (before its start or past its end)",
    E.corrupt_message: "a record batch failed its CRC check or could not be decoded",
    E.unknown_topic_or_partition: "the topic or partition does not exist (`strom topics list` shows the topics)",
    E.invalid_fetch_size: "the fetch asked for a size the broker does not accept",
    E.leader_not_available: "the partition has no leader right now (the topic may still be being created); "
    "try again shortly",
    E.not_leader_or_follower: "this broker does not host the partition any more; the client refreshes its "
    "metadata and retries",
    E.request_timed_out: "the broker did not answer in time",
    E.broker_not_available: "the broker is not available",
    E.replica_not_available: "a replica of the partition is not available",
    E.message_too_large: "a record batch is larger than the topic's max.message.bytes (or the broker's "
    "message.max.bytes) allows",
    E.stale_controller_epoch: "the request came from a controller that has been replaced",
    E.offset_metadata_too_large: "the metadata string committed with an offset is longer than "
    "offset.metadata.max.bytes allows",
    E.network_exception: "the connection to the broker was lost before it answered",
    E.coordinator_load_in_progress: "the group's coordinator is still loading its state; try again shortly",
    E.coordinator_not_available: "no coordinator is available for the group (the offsets topic may not be "
    "ready yet); try again shortly",
    E.not_coordinator: "this broker is not the group's coordinator any more; the client looks it up again",
    E.invalid_topic_exception: "the topic name is not valid: 1 to 249 characters of letters, digits, '.', "
    "'_' and '-', and not '.' or '..'",
    E.record_list_too_large: "the produce request is larger than the broker accepts",
    E.not_enough_replicas: "fewer replicas are in sync than the topic's min.insync.replicas requires",
    E.not_enough_replicas_after_append: "the records were written, but fewer replicas than "
    "min.insync.replicas acknowledged them",
    E.invalid_required_acks: "acks must be 0, 1 or -1 (all)",
    E.illegal_generation: "the group rebalanced: this member's generation is out of date and it must rejoin",
    E.inconsistent_group_protocol: "the member's partition assignors or protocol type do not match the "
    "group's other members",
    E.invalid_group_id: "the group id is not valid (it must not be empty)",
    E.unknown_member_id: "the coordinator does not know this member (it was removed, e.g. after its "
    "session timed out); it must rejoin",
    E.invalid_session_timeout: "session.timeout.ms is outside the broker's group.min.session.timeout.ms "
    "and group.max.session.timeout.ms",
    E.rebalance_in_progress: "the group is rebalancing; the member rejoins and retries",
    E.invalid_commit_offset_size: "the offset commit is too large",
    E.topic_authorization_failed: "the client is not authorized to access the topic",
    E.group_authorization_failed: "the client is not authorized to access the group",
    E.cluster_authorization_failed: "the client is not authorized for this cluster operation",
    E.invalid_timestamp: "a record's timestamp is outside the range the topic accepts "
    "(message.timestamp.before.max.ms / after.max.ms)",
    E.unsupported_sasl_mechanism: "the broker does not support the SASL mechanism asked for",
    E.illegal_sasl_state: "a SASL request came at a point of the handshake where it is not allowed",
    E.unsupported_version: "the broker does not support a version of this request that the client speaks",
    E.topic_already_exists: "a topic with this name already exists (topics create --if-not-exists "
    "accepts that)",
    E.invalid_partitions: "the partition count is not valid (it must be at least 1, and can only grow)",
    E.invalid_replication_factor: "the replication factor is not valid: at least 1 and at most the "
    "number of brokers",
    E.invalid_replica_assignment: "the replica assignment is not valid",
    E.invalid_config: "a config name or value is not valid",
    E.not_controller: "this broker is not the controller any more; the client finds the new one",
    E.invalid_request: "the broker could not make sense of the request",
    E.unsupported_for_message_format: "the request needs a newer record format than the topic uses",
    E.policy_violation: "the request breaks a policy configured on the broker",
    E.out_of_order_sequence_number: "the broker received a producer's batch out of sequence (a batch "
    "before it was lost)",
    E.duplicate_sequence_number: "the broker already has this producer's batch (a retry of a write that "
    "succeeded)",
    E.invalid_producer_epoch: "a newer producer with the same transactional id has fenced this one",
    E.invalid_txn_state: "the transaction is not in a state that allows this operation",
    E.invalid_producer_id_mapping: "the producer id does not belong to this transactional id",
    E.invalid_transaction_timeout: "transaction.timeout.ms is larger than the broker's "
    "transaction.max.timeout.ms",
    E.concurrent_transactions: "the previous transaction of this producer is still being completed; "
    "the client retries",
    E.transaction_coordinator_fenced: "the transaction coordinator has been replaced",
    E.transactional_id_authorization_failed: "the client is not authorized for this transactional id",
    E.security_disabled: "security features are disabled on this broker",
    E.operation_not_attempted: "the broker did not attempt this part of the request because another "
    "part of it failed",
    E.kafka_storage_error: "the broker could not read or write the partition's log directory",
    E.log_dir_not_found: "the log directory asked for does not exist on the broker",
    E.sasl_authentication_failed: "SASL authentication failed",
    E.unknown_producer_id: "the broker no longer knows this producer id (its state expired or was "
    "deleted with the records)",
    E.reassignment_in_progress: "a replica reassignment of the partition is in progress",
    E.delegation_token_auth_disabled: "delegation tokens are disabled on this broker",
    E.delegation_token_not_found: "no such delegation token",
    E.delegation_token_owner_mismatch: "the delegation token belongs to another principal",
    E.delegation_token_request_not_allowed: "delegation tokens cannot be requested over this connection",
    E.delegation_token_authorization_failed: "the client is not authorized for this delegation token",
    E.delegation_token_expired: "the delegation token has expired",
    E.invalid_principal_type: "the principal type is not supported",
    E.non_empty_group: "the group still has active members; stop its consumers (or wait for them to "
    "leave the group) and try again",
    E.group_id_not_found: "no consumer group with this id exists (`strom groups list` shows the groups)",
    E.fetch_session_id_not_found: "the broker no longer has this fetch session; the consumer starts a new one",
    E.invalid_fetch_session_epoch: "the fetch session's epoch is out of step; the consumer starts a new "
    "session",
    E.listener_not_found: "the broker has no listener of the name this connection arrived on for the "
    "partition's leader",
    E.topic_deletion_disabled: "topic deletion is disabled on this broker (delete.topic.enable=false)",
    E.fenced_leader_epoch: "the client's leader epoch is older than the broker's; it refreshes its metadata",
    E.unknown_leader_epoch: "the client's leader epoch is newer than the broker knows; it retries",
    E.unsupported_compression_type: "the consumer cannot read the compression type used by these records",
    E.stale_broker_epoch: "the request carries an outdated broker epoch",
    E.offset_not_available: "the leader cannot serve this offset yet; try again shortly",
    E.member_id_required: "the coordinator assigned the member an id; the member joins again with it",
    E.preferred_leader_not_available: "the preferred leader of the partition is not available",
    E.group_max_size_reached: "the group already has group.max.size members",
    E.fenced_instance_id: "another member with the same group.instance.id has replaced this one",
    E.eligible_leaders_not_available: "no replica of the partition is eligible to become leader",
    E.election_not_needed: "the partition already has the leader asked for",
    E.no_reassignment_in_progress: "no replica reassignment of the partition is in progress",
    E.group_subscribed_to_topic: "the group's active members consume this topic; stop them before "
    "deleting its offsets",
    E.invalid_record: "the broker refused a record as invalid (e.g. a compacted topic's record needs a key)",
    E.unstable_offset_commit: "the group has offsets in a transaction that is not complete yet; the "
    "client retries",
    E.throttling_quota_exceeded: "the request exceeds a quota on the rate of this operation",
    E.producer_fenced: "a newer producer with the same transactional id has fenced this one",
    E.resource_not_found: "the resource asked for does not exist",
    E.duplicate_resource: "the request names the same resource twice",
    E.unacceptable_credential: "the credential does not meet the broker's requirements",
    E.inconsistent_voter_set: "the request's controller quorum voters do not match the receiver's",
    E.invalid_update_version: "the feature update's version is not valid",
    E.feature_update_failed: "the broker could not apply the feature update",
    E.principal_deserialization_failure: "the broker could not read the principal in the request",
    E.snapshot_not_found: "the metadata snapshot asked for does not exist",
    E.position_out_of_range: "the position asked for is outside the metadata snapshot",
    E.unknown_topic_id: "no topic with this topic id exists (it may have been deleted)",
    E.duplicate_broker_registration: "a broker with this id is already registered",
    E.broker_id_not_registered: "no broker with this id is registered",
    E.inconsistent_topic_id: "the topic id does not match the topic's (it was deleted and created again)",
    E.inconsistent_cluster_id: "the request comes from a member of another cluster",
    E.transactional_id_not_found: "no transaction with this transactional id exists",
    E.fetch_session_topic_id_error: "the fetch session's topic ids are inconsistent; the consumer starts a "
    "new session",
    E.ineligible_replica: "the replica cannot be added to the in-sync replicas",
    E.new_leader_elected: "a new leader was elected for the partition; the client retries there",
    E.offset_moved_to_tiered_storage: "the offset is only in tiered storage, which this broker does not serve",
    E.fenced_member_epoch: "the member's epoch is out of date; it rejoins the group",
    E.unreleased_instance_id: "the group.instance.id is still held by a member that has not left",
    E.unsupported_assignor: "the group does not support the assignor asked for",
    E.stale_member_epoch: "the member's epoch is stale; it rejoins the group",
    E.mismatched_endpoint_type: "the request arrived on the wrong kind of endpoint (broker or controller)",
    E.unsupported_endpoint_type: "this endpoint type does not support the request",
    E.unknown_controller_id: "no controller with this id is known",
    E.unknown_subscription_id: "no client telemetry subscription with this id exists",
    E.telemetry_too_large: "the client telemetry payload is larger than the broker accepts",
    E.invalid_registration: "the broker registration is not valid",
    E.transaction_abortable: "the transaction failed and must be aborted; the producer can then carry on",
    E.invalid_record_state: "the record is not in a state that allows this operation",
    E.share_session_not_found: "the broker no longer has this share session",
    E.invalid_share_session_epoch: "the share session's epoch is out of step",
    E.fenced_state_epoch: "the share-group state epoch is out of date",
    E.invalid_voter_key: "the voter key does not match the controller quorum",
    E.duplicate_voter: "this voter is already in the controller quorum",
    E.voter_not_found: "no such voter in the controller quorum",
    E.invalid_regular_expression: "the subscription's regular expression is not valid",
    E.rebootstrap_required: "the client must reconnect to its bootstrap servers",
    E.streams_invalid_topology: "the Streams topology is not valid",
    E.streams_invalid_topology_epoch: "the Streams topology epoch is not valid",
    E.streams_topology_fenced: "a newer Streams topology has replaced this one",
    E.share_session_limit_reached: "the broker has as many share sessions as it allows",
}


def explain(exc: KafkaException) -> str:
    """The exception's message, with the sentence for its error code when it has one."""
    message = str(exc)
    sentence = SENTENCES.get(exc.error_code) if exc.error_code is not None else None
    if sentence is None or sentence in message:
        return message
    return f"{message}: {sentence}"
