drop trigger budgets_catalogue on budgets;
