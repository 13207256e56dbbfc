//! Integration tests of the REST API against a real PostgreSQL.

mod arrays;
mod auth;
mod authorization;
mod bad_input;
mod billing;
mod ci_federation;
mod dependencies;
mod follow;
mod hardening;
mod idempotency;
mod job_spec;
mod jobs;
mod leadership;
mod lifecycle;
mod logs;
mod migrations;
mod observability;
mod openapi;
mod portal;
mod portal_admin;
mod services;
mod sim_backend;
mod single_sign_on;
mod templates;
mod tenancy;
mod webhooks;
