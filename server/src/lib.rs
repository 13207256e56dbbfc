//! Fairway: a multi-tenant GPU platform. Teams with reserved and burst quotas per GPU class,
//! fair-share admission, dispatch to clusters, and chargeback per GPU-second.
//!
//! Modules are layered and dependencies point down only (`ARCHITECTURE.md` at the root is
//! the map; a unit test, `layers`, fails on an upward import):
//!
//! - [`serve`], [`bench`]: the service's wiring and lifecycle; benchmark commands.
//! - [`api`], [`web`]: the faces, REST handlers and portal pages. Thin.
//! - [`client`]: the face for CI pipelines and terminals (`fairway submit`, ...), which talks
//!   to a server over HTTP only and names no other module.
//! - [`http`]: what the faces share about HTTP: problems, extractors, idempotency,
//!   authentication and authorization middleware, request ids.
//! - [`ops`], [`demo`]: the use cases, called alike by every face.
//! - [`state`]: what every request shares.
//! - [`auth`]: principals, tokens, JWT, passwords, policies.
//! - [`control`]: the control loop (leader, scheduling cycle, dispatch, reconcile, meter).
//! - [`billing`], [`backends`], [`simulate`], [`config`]: money, clusters, trace replay, settings.
//! - [`metering`], [`scheduler`] (pure), [`telemetry`]: GPU time, the engine, logs and metrics.
//! - [`db`] (all SQL), [`domain`] (typed values and their rules), [`rng`].

pub mod api;
pub mod auth;
pub mod backends;
pub mod bench;
pub mod billing;
pub mod client;
pub mod config;
pub mod control;
pub mod db;
pub mod demo;
pub mod domain;
pub mod http;
pub mod idp;
pub mod metering;
pub mod ops;
pub mod rng;
pub mod scheduler;
pub mod serve;
pub mod simulate;
pub mod state;
pub mod telemetry;
pub mod web;

#[cfg(test)]
mod layers;
