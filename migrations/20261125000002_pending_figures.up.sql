-- The numbers behind a waiting job's reason (what it needs, what is free, the quota or budget
-- that blocks it), as the cycle that gave the reason saw them: `domain::job::WaitFigures`.
alter table jobs add column pending_figures jsonb;
