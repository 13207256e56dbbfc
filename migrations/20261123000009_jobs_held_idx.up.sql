-- The reconciler reads the jobs holding GPUs on a cluster several times a second; with ten
-- thousand jobs queued the live-jobs index alone made that a scan of the queue.
create index jobs_held_idx on jobs (cluster_id) where holds_gpus;
