-- The runtime a job declares it expects at submission (`scheduler::runtime` takes it as the
-- median of the job's runtime forecast instead of its team's history); null when it declares
-- none. Never more than the job's maximum runtime, which stops it anyway.
alter table jobs add column expected_runtime_seconds integer
    constraint jobs_expected_runtime_check
    check (expected_runtime_seconds > 0 and expected_runtime_seconds <= max_runtime_seconds);
