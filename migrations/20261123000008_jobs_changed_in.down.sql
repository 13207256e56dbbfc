drop trigger jobs_mark_changed on jobs;
drop function jobs_mark_changed();
alter table jobs drop column changed_in;
