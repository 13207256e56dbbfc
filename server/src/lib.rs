//! Fairway: a multi-tenant GPU platform. Teams with reserved and burst quotas per GPU class,
//! fair-share admission, dispatch to clusters, and chargeback per GPU-second.
//!
//! One module per part of the product (see `DESIGN.md`): [`api`] (REST handlers),
//! [`auth`], [`domain`] (types and validation), [`db`] (all SQL), [`config`],
//! [`telemetry`], and [`app`] which ties them into the running service.

pub mod api;
pub mod app;
pub mod auth;
pub mod backends;
pub mod bench;
pub mod billing;
pub mod config;
pub mod control;
pub mod db;
pub mod demo;
pub mod domain;
pub mod metering;
pub mod rng;
pub mod scheduler;
pub mod simulate;
pub mod telemetry;
pub mod web;
