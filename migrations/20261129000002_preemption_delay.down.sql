alter table jobs drop column preemption_delay_seconds;
alter table priority_classes drop column preemption_delay_seconds;
