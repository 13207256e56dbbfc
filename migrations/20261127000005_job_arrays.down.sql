drop index jobs_held_by_array_idx;
alter table jobs drop column held_by_array;
drop index jobs_array_id_index_idx;
alter table jobs drop constraint jobs_array_task_check;
alter table jobs drop column array_index;
alter table jobs drop column array_id;
drop table job_arrays;
