-- The tables quorum-dbd writes: one row per job that left a Quorum cluster's hot state, one per
-- step of it, and where the export of each cluster stands. quorum-dbd creates them when they are
-- missing; a site may create them itself (and grant quorum-dbd INSERT, UPDATE, DELETE and SELECT).
-- Times are timestamptz, durations seconds, memory as named. A job's row is written again, whole,
-- whenever the export meets it again (job id and cluster are the key), so a restarted exporter
-- never leaves a job twice or half-written.

CREATE TABLE IF NOT EXISTS quorum_jobs (
    cluster        text        NOT NULL,
    job_id         bigint      NOT NULL,
    -- an array task: its array's id (the first task's job id) and its task id
    array_job_id   bigint,
    array_task_id  integer,
    name           text        NOT NULL,
    user_name      text        NOT NULL,
    account        text        NOT NULL,
    partition      text        NOT NULL,
    qos            text        NOT NULL,
    -- Slurm's names: COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY
    state          text        NOT NULL,
    -- why it last waited (Slurm's Reason), None when it did not
    reason         text        NOT NULL,
    exit_code      integer,
    -- the signal that killed it, if one did
    signal         integer,
    -- times it went back to the queue after a node failed
    requeues       integer     NOT NULL,
    submit_time    timestamptz NOT NULL,
    start_time     timestamptz,
    end_time       timestamptz,
    -- end - start (0 for a job that never started)
    elapsed_s      bigint      NOT NULL,
    time_limit_s   bigint,
    -- Slurm's host list (n[1-3]) and what it was given on them
    node_list      text        NOT NULL,
    node_count     integer     NOT NULL,
    alloc_cpus     integer     NOT NULL,
    alloc_gpus     integer     NOT NULL,
    alloc_mem_mb   bigint      NOT NULL,
    -- what it used, its batch script and its steps together, summed over its nodes (the
    -- largest resident set of one process)
    cpu_user_s     double precision,
    cpu_system_s   double precision,
    max_rss_kb     bigint,
    -- its GPUs, sampled while it ran: mean utilization (percent), the most memory one held
    -- (MiB), the energy they drew (joules); NULL for a job without GPU samples
    gpu_util_pct   double precision,
    gpu_mem_max_mb bigint,
    gpu_energy_j   double precision,
    work_dir       text        NOT NULL,
    -- where it entered the job history: the Raft index of the entry that moved it there
    history_index  bigint      NOT NULL,
    -- the whole record as the history keeps it (JSON of quorum-model's Job)
    record         jsonb       NOT NULL,
    exported_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (cluster, job_id)
);

CREATE INDEX IF NOT EXISTS quorum_jobs_user_end ON quorum_jobs (cluster, user_name, end_time);
CREATE INDEX IF NOT EXISTS quorum_jobs_account_end ON quorum_jobs (cluster, account, end_time);
CREATE INDEX IF NOT EXISTS quorum_jobs_end ON quorum_jobs (cluster, end_time);

CREATE TABLE IF NOT EXISTS quorum_steps (
    cluster        text        NOT NULL,
    job_id         bigint      NOT NULL,
    -- <job>.<step_id>, as sacct names steps
    step_id        integer     NOT NULL,
    name           text        NOT NULL,
    state          text        NOT NULL,
    exit_code      integer,
    signal         integer,
    start_time     timestamptz NOT NULL,
    end_time       timestamptz,
    node_list      text        NOT NULL,
    ntasks         integer     NOT NULL,
    cpus           integer     NOT NULL,
    -- what its tasks used, summed (the largest resident set of one task)
    cpu_user_s     double precision,
    cpu_system_s   double precision,
    max_rss_kb     bigint,
    PRIMARY KEY (cluster, job_id, step_id),
    FOREIGN KEY (cluster, job_id) REFERENCES quorum_jobs (cluster, job_id) ON DELETE CASCADE
);

-- Where each cluster's export stands: the last job exported, by its place in the history. Moved
-- in the same transaction as the rows it covers.
CREATE TABLE IF NOT EXISTS quorum_export (
    cluster        text        PRIMARY KEY,
    after_index    bigint      NOT NULL,
    after_job_id   bigint      NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
