-- Submissions are checked against the budgets over their team only when the team's chain has
-- a budget at all; whether it has one is part of the cached catalogue, so a budget set or
-- removed bumps the catalogue version like a quota change does.
create trigger budgets_catalogue after insert or delete or truncate on budgets
    for each statement execute function bump_catalogue_version();
