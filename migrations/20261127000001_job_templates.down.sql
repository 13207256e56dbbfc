drop table job_templates;
