alter table jobs drop column attained_ms;
