"""The experience store: what the agent did, what came of it, and what it learned.

SQLite (through sqlite-utils) is the source of truth; a Chroma index over
trajectories, insights and tools answers similarity queries, fused with FTS5
keyword search. This package depends on no other package of the project.
"""

from . import _offline  # noqa: F401  (before chromadb, transformers, litellm)
from .attempts import NewTrajectory
from .effects import Effect
from .embedder import Embedder, bundled_model_path
from .errors import (
    AmbiguousId,
    EmbeddingMismatch,
    IndexBusy,
    NotFound,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreLocked,
    StoreReadOnly,
)
from .inbox import TERMINAL as TERMINAL_STATUSES
from .inbox import Lease
from .protocol import (
    AttemptStore,
    ExperienceStore,
    ExposureStore,
    InboxStore,
    InsightStore,
    LearnedStore,
    Reports,
    RetrievalStore,
    ToolStore,
    TreeStore,
)
from .records import (
    Context,
    Ending,
    Evaluation,
    Event,
    Insight,
    InsightHit,
    LedgerEntry,
    Node,
    Outcome,
    Step,
    Task,
    TaskKind,
    TaskStatus,
    ToolHit,
    ToolRecord,
    Trajectory,
    TrajectoryHit,
)
from .roles import AgentStore, AttemptRecords, CallLedger
from .search import Filters
from .store import Store, StoreOptions, new_id
from .tool_log import NewTool, RecordedCall

__all__ = [
    "ExperienceStore",
    "AgentStore",
    "AttemptRecords",
    "CallLedger",
    "InboxStore",
    "TreeStore",
    "LearnedStore",
    "AttemptStore",
    "InsightStore",
    "ToolStore",
    "ExposureStore",
    "RetrievalStore",
    "Reports",
    "Store",
    "StoreOptions",
    "NewTrajectory",
    "NewTool",
    "RecordedCall",
    "Effect",
    "Filters",
    "Lease",
    "TERMINAL_STATUSES",
    "Embedder",
    "bundled_model_path",
    "new_id",
    "Ending",
    "Task",
    "TaskKind",
    "TaskStatus",
    "Trajectory",
    "Step",
    "Outcome",
    "Insight",
    "ToolRecord",
    "Node",
    "Evaluation",
    "LedgerEntry",
    "Event",
    "TrajectoryHit",
    "InsightHit",
    "ToolHit",
    "Context",
    "StoreError",
    "StoreCorrupt",
    "StoreLocked",
    "StoreReadOnly",
    "StoreFull",
    "IndexBusy",
    "EmbeddingMismatch",
    "NotFound",
    "AmbiguousId",
]
