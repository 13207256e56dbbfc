drop index jobs_waits_for_dependencies_idx;
alter table jobs drop column waits_for_dependencies;
alter table jobs drop column if_dependency_fails;
drop table job_dependencies;
