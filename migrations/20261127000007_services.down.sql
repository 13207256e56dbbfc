-- Replicas stay, as jobs, with their bills: their "no maximum runtime" becomes the longest
-- a job may have.
update jobs set max_runtime_seconds = 2592000 where service_id is not null;
alter table jobs drop constraint jobs_max_runtime_check;
alter table jobs add constraint jobs_max_runtime_check check (max_runtime_seconds between 1 and 2592000);
drop index jobs_service_id_slot_idx;
alter table jobs drop constraint jobs_service_replica_check;
alter table jobs drop column service_revision;
alter table jobs drop column service_slot;
alter table jobs drop column service_id;
drop table service_endpoints;
drop table services;
