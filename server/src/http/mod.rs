//! What the two faces (the REST API and the portal) share about HTTP: the problem-document
//! error and its mapping from use-case errors, request extractors (JSON bodies whose structs
//! must be objects), the door every request passes (header limit, HSTS, `Connection: close`),
//! refusal of text the database cannot store, idempotency keys,
//! authentication and authorization middleware, conditional reads (`If-None-Match`), and
//! request ids with their span.

pub mod authorize;
pub mod conditional;
pub mod edge;
pub mod error;
pub mod extract;
pub mod hostile;
pub mod idempotency;
pub mod objects_only;
pub mod trace;
