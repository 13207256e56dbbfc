-- Dependencies between jobs, as Slurm's --dependency=afterok/afterany/afternotok: a job
-- waits until every job it names has succeeded, finished (any final state) or failed (any
-- final state other than succeeded). A dependency must name a job that already exists, so
-- dependencies never form a cycle.
create table job_dependencies (
    job_id     uuid not null constraint job_dependencies_job_id_fkey references jobs (id) on delete cascade,
    depends_on uuid not null constraint job_dependencies_depends_on_fkey references jobs (id) on delete cascade,
    after      text not null constraint job_dependencies_after_check check (after in ('succeeded', 'finished', 'failed')),
    constraint job_dependencies_pkey primary key (job_id, depends_on),
    constraint job_dependencies_not_itself_check check (job_id <> depends_on)
);
-- The jobs that depend on one: what the job page shows as its dependents.
create index job_dependencies_depends_on_idx on job_dependencies (depends_on);

-- What becomes of a job whose dependency can no longer be met: cancelled, or kept pending.
alter table jobs add column if_dependency_fails text not null default 'cancel'
    constraint jobs_if_dependency_fails_check check (if_dependency_fails in ('cancel', 'keep'));
-- True from submission until the leader's dependency pass finds every dependency met (or
-- cancels the job): the scheduler's snapshot skips such jobs, and the pass reads only them,
-- through the partial index below, which is empty when nothing waits.
alter table jobs add column waits_for_dependencies boolean not null default false;
create index jobs_waits_for_dependencies_idx on jobs (seq) where waits_for_dependencies;
