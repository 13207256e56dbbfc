-- Portal sessions: the cookie holds a random secret, the table its SHA-256, so a leaked
-- table reveals no usable session. Each session carries the token its forms must echo
-- (CSRF).
create table web_sessions (
    secret_hash bytea primary key,
    user_id     uuid not null constraint web_sessions_user_id_fkey references users (id) on delete cascade,
    csrf_token  text not null,
    created_at  timestamptz not null default now(),
    expires_at  timestamptz not null
);
create index web_sessions_expires_idx on web_sessions (expires_at);
