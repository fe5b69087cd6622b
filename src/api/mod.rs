//! The Agent API surface: its operations and routes, the request body schemas, the OpenAPI
//! document generated from them, the answers the gateway gives by itself, and the failures
//! that make it give them.

pub mod failure;
pub mod openapi;
pub mod operation;
pub mod reply;
pub mod route;
pub mod schema;
