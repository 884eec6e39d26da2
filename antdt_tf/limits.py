"""The bounds the master enforces on what a request may ask for (documented in
docs/security.md, "Requests the master refuses"). Every request is checked against
them before anything is journaled, so no request can make the master's state
unrepresentable (int64 fields, a snapshot larger than a gRPC message) or exhaust its
memory; one that exceeds them is refused with INVALID_ARGUMENT and changes nothing."""

# ---- datasets (RegisterDataset, RestoreState)
MAX_DATASETS = 1000                 # registered at once
MAX_NAME_CHARS = 128                # dataset name
MAX_RECORDS_PER_EPOCH = 1 << 40     # ~1.1e12 records; x MAX_EPOCHS still fits in int64
MAX_EPOCHS = 1_000_000
MAX_FILES = 100_000                 # files of one dataset
MAX_PATH_CHARS = 4096               # a file path
MAX_SPEC_BYTES = 1 << 20            # one serialized DatasetSpec
MAX_TOTAL_SPEC_BYTES = 2 << 20      # all registered specs: a snapshot stays < 4 MiB
MAX_STATIC_SHARDS = 100_000         # shards per epoch of a statically sharded dataset
MAX_STATIC_WORKERS = 100_000

# ---- tasks and leases
MAX_TASKS = 10_000                  # distinct task (type, index) pairs
MAX_TASK_INDEX = 1_000_000
MAX_TASK_TYPE_CHARS = 32
MAX_INCARNATION = 1 << 62
MAX_LEASE_ID = 1 << 53              # RestoreState's next_lease_id
MAX_COUNTER = 1 << 62               # counters a snapshot carries (records done, leases)
MAX_BATCH_SIZE = 1 << 20            # SetBatchSizes
MAX_REPORT_LEASES = 10_000          # leases in one TF-RPC antdt.report

# ---- cluster monitor
MAX_AGENTS = 1024                   # hosts whose reports are kept
MAX_AGENT_REPORT_BYTES = 64 << 10   # one serialized AgentReport
MAX_AGENT_REPORTS_BYTES = 2 << 20   # all kept agent reports (GetClusterStatus < 4 MiB)
MAX_TRAINER_REPORT_BYTES = 1 << 20
MAX_PS = 10_000                     # PS index in a trainer report
MAX_ADDRESS_CHARS = 255             # host:port (agents, JobCluster, JobSpec)
MAX_CLUSTER_TASKS = 10_000          # addresses per job in a JobCluster
MAX_HOST_CHARS = 255

# ---- jobs (SubmitJob)
MAX_JOB_PS = 1000
MAX_JOB_WORKERS = 10_000
MAX_JOB_HOSTS = 1000
MAX_JOB_BUCKETS = 1 << 24
MAX_INJECTIONS = 1000
MAX_RESTARTS = 1000
MAX_SECONDS = 365 * 24 * 3600.0     # any duration in a JobSpec
MAX_STRING_CHARS = 4096             # any other string field of a JobSpec
