-- The tail of every replica's log per attempt, as the control loop's collector read it from
-- the backend (`control::logs`). Kept here because clusters delete finished pods and cloud
-- logs expire: the log of a failed attempt must still be readable a week later. Bounded: the
-- collector keeps the newest lines of each replica and attempt and counts the ones it let go.
create table job_logs (
    id      bigint generated always as identity primary key,
    job_id  uuid not null constraint job_logs_job_id_fkey references jobs (id) on delete cascade,
    attempt integer not null,
    replica integer not null,
    at      timestamptz not null,
    line    text not null
);
create index job_logs_replica_idx on job_logs (job_id, attempt, replica, id);

-- Where the collector is in each replica's log: the newest line's time it kept and how many
-- lines at exactly that time (a backend filters by time, so the next read starts there and
-- skips those), how many older lines it let go, and whether the attempt ended and its last
-- lines were read.
create table job_log_cursors (
    job_id    uuid not null constraint job_log_cursors_job_id_fkey references jobs (id) on delete cascade,
    attempt   integer not null,
    replica   integer not null,
    read_to   timestamptz,
    read_at_to integer not null default 0,
    dropped   bigint not null default 0,
    complete  boolean not null default false,
    primary key (job_id, attempt, replica)
);
