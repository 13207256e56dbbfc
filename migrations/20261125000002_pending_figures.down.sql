alter table jobs drop column pending_figures;
