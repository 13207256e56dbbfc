drop index jobs_held_idx;
