//! The Agent API surface: its operations and routes, the request body schemas, the OpenAPI
//! document generated from them, and the answers the gateway gives by itself.

pub mod openapi;
pub mod operation;
pub mod reply;
pub mod route;
pub mod schema;
