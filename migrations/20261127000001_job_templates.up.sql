-- Saved job requests per team: what a team submits again and again (a nightly evaluation, a
-- fine-tuning recipe), kept by name so a person or a pipeline submits it with only what
-- changes. The request is stored as the API's job fields, validated when it was saved.
create table job_templates (
    team_id    uuid not null constraint job_templates_team_id_fkey references teams (id) on delete cascade,
    -- Lowercase letters, digits, '-', '_' and '.': it is also the value of the label
    -- `fairway.dev/template` on the jobs submitted from it.
    name       text not null,
    spec       jsonb not null constraint job_templates_spec_check check (jsonb_typeof(spec) = 'object'),
    created_by text not null,
    created_at timestamptz not null default now(),
    updated_by text not null,
    updated_at timestamptz not null default now(),
    -- Bumped on every change: the ETag, so two people editing one template cannot overwrite
    -- each other unknowingly.
    version    bigint not null default 1,
    constraint job_templates_pkey primary key (team_id, name)
);
