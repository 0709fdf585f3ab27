"""Local storage: partition logs made of segments, their indexes, recovery, retention, compaction,
producer state and transactions."""

from strom.storage.append_origin import AppendOrigin
from strom.storage.cleaner import CleanerConfig, CleanerStats, LogCleaner, LogToClean
from strom.storage.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTimestampError,
    InvalidTxnStateError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    StorageError,
    TransactionCoordinatorFencedError,
    UnknownProducerIdError,
)
from strom.storage.leader_epoch_cache import LeaderEpochFileCache
from strom.storage.local_log import FetchDataInfo, LocalLog, TimestampAndOffset
from strom.storage.log_config import LogConfig
from strom.storage.log_loader import CLEAN_SHUTDOWN_FILE, LogLoader
from strom.storage.log_manager import LogDirInUseError, LogManager, NewLog
from strom.storage.producer_state import BatchMetadata, CompletedTxn, ProducerStateEntry, ProducerStateManager
from strom.storage.transaction_index import AbortedTxn, TransactionIndex
from strom.storage.unified_log import (
    EARLIEST_LOCAL_TIMESTAMP,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    InconsistentTopicIdError,
    LogAppendInfo,
    UnifiedLog,
)

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "EARLIEST_LOCAL_TIMESTAMP",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "MAX_TIMESTAMP",
    "AbortedTxn",
    "AppendOrigin",
    "BatchMetadata",
    "CleanerConfig",
    "CleanerStats",
    "CompletedTxn",
    "CorruptRecordError",
    "FetchDataInfo",
    "InconsistentTopicIdError",
    "InvalidProducerEpochError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "InvalidTxnStateError",
    "KafkaStorageError",
    "LeaderEpochFileCache",
    "LocalLog",
    "LogAppendInfo",
    "LogCleaner",
    "LogConfig",
    "LogDirInUseError",
    "LogLoader",
    "LogManager",
    "LogToClean",
    "NewLog",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "ProducerStateEntry",
    "ProducerStateManager",
    "RecordTooLargeError",
    "StorageError",
    "TimestampAndOffset",
    "TransactionCoordinatorFencedError",
    "TransactionIndex",
    "UnifiedLog",
    "UnknownProducerIdError",
]
