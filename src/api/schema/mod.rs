//! The spec's request body schemas (section 2) as data, and the validator that enforces them.
//!
//! The four request bodies and their item objects are static tables ([`ObjectSchema`],
//! [`Field`], [`Constraint`]). [`validate`] enforces them and [`crate::api::openapi`] documents
//! them, both from the same tables, so what the gateway checks and what it publishes cannot
//! drift.
//!
//! # What [`validate`] accepts
//! - The body is UTF-8 JSON (RFC 8259) holding one object; anything else is `not_json` or
//!   `not_object`. A syntax error anywhere wins over every other violation.
//! - A declared field has its declared type: string, boolean, or array of objects whose own
//!   fields are checked the same way (`item_required`, `item_type`).
//! - An explicit `null` counts as absent: accepted for an optional field, `required` for a
//!   required one. Clients that serialize unset options as `null` are common, and `null`
//!   carries no value the backend could act on.
//! - A declared field given twice is `duplicate`: JSON parsers disagree on which copy wins,
//!   so the backend might act on the copy the gateway did not check.
//! - Fields the schema does not declare are allowed and not inspected beyond being JSON.
//! - The cross-field rules of spec section 4: rule 2 and rule 3 ([`Constraint`]).
//! - Where the spec is silent the validator is lenient and leaves the verdict to the
//!   backend: empty strings, and an empty `credential_values`, which satisfies rule 3.
//! - An unpaired UTF-16 surrogate escape (`"\ud800"`) is `not_json` where the validator
//!   reads the string (a key, a declared field) and passes where it skips it (an undeclared
//!   field's value): serde_json cannot make such a string, and RFC 8259 leaves its meaning
//!   open, so this is left to the backend rather than paid for with a second parse.
//!
//! One violation is reported: the first wrong field in document order, else the first missing
//! field in schema order, else the first broken cross-field rule. The body is read in one
//! pass; undeclared fields are skipped without being copied. A [`Violation`]'s path is built
//! from the schema's names and array indexes, never from client text, so
//! [`Violation::message`] is safe to send back.

use std::fmt::{self, Write as _};

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::api::route::Operation;

/// The JSON type of a declared field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    String,
    Boolean,
    /// An array whose items are objects of the given schema.
    ArrayOf(&'static ObjectSchema),
}

impl FieldType {
    /// The JSON Schema `type` keyword.
    pub fn json_type(self) -> &'static str {
        match self {
            FieldType::String => "string",
            FieldType::Boolean => "boolean",
            FieldType::ArrayOf(_) => "array",
        }
    }

    /// The type as a message says it ("must be a string").
    fn noun(self) -> &'static str {
        match self {
            FieldType::String => "a string",
            FieldType::Boolean => "a boolean",
            FieldType::ArrayOf(_) => "an array of objects",
        }
    }
}

/// One declared field of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub ty: FieldType,
    pub required: bool,
    pub description: &'static str,
}

/// A rule between two fields of one object. Present means given and not `null`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Constraint {
    /// When `when` is present, `then` must be present too.
    Requires {
        when: &'static str,
        then: &'static str,
        rule: Rule,
    },
    /// When `when` is present, `then` must be absent.
    Excludes {
        when: &'static str,
        then: &'static str,
        rule: Rule,
    },
}

impl Constraint {
    /// The rule label a violation of this constraint carries.
    pub fn rule(self) -> Rule {
        match self {
            Constraint::Requires { rule, .. } | Constraint::Excludes { rule, .. } => rule,
        }
    }

    /// The field a violation names (the one to add or remove).
    pub fn field(self) -> &'static str {
        match self {
            Constraint::Requires { then, .. } | Constraint::Excludes { then, .. } => then,
        }
    }

    /// The rule as a sentence, for messages and the OpenAPI descriptions.
    pub fn sentence(self) -> String {
        match self {
            Constraint::Requires { when, then, .. } => {
                format!("{then} is required when {when} is given")
            }
            Constraint::Excludes { when, then, .. } => {
                format!("{then} may only be used without {when}")
            }
        }
    }
}

/// A JSON object's declared fields and cross-field rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectSchema {
    /// The spec's schema name, also the OpenAPI component name.
    pub name: &'static str,
    pub description: &'static str,
    /// At most 64 (the validator keeps one bit per field).
    pub fields: &'static [Field],
    pub constraints: &'static [Constraint],
}

impl ObjectSchema {
    fn index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }

    /// The schemas of this object's array items, directly nested.
    pub fn item_schemas(&self) -> impl Iterator<Item = &'static ObjectSchema> + '_ {
        self.fields.iter().filter_map(|f| match f.ty {
            FieldType::ArrayOf(s) => Some(s),
            _ => None,
        })
    }
}

const fn field(
    name: &'static str,
    ty: FieldType,
    required: bool,
    description: &'static str,
) -> Field {
    Field {
        name,
        ty,
        required,
        description,
    }
}

const REQUEST_UID: Field = field(
    "request_uid",
    FieldType::String,
    false,
    "Identifier of the request; generated automatically when absent.",
);

pub static VERIFY_REQUEST: ObjectSchema = ObjectSchema {
    name: "VerifyRequest",
    description: "Asks a holder to present a proof, on an existing connection or on a pairwise \
                  connection performed automatically first.",
    fields: &[
        field(
            "business_code",
            FieldType::String,
            true,
            "Business code of the verify proof.",
        ),
        field(
            "connection_id",
            FieldType::String,
            false,
            "Connection to which the request is sent. When absent, a pairwise connection is \
             performed automatically first.",
        ),
        field(
            "allow_multiple_read",
            FieldType::Boolean,
            false,
            "Usable only when connection_id is absent. true: the verify request can be used \
             several times; false: it cannot.",
        ),
        REQUEST_UID,
    ],
    constraints: &[Constraint::Excludes {
        when: "connection_id",
        then: "allow_multiple_read",
        rule: Rule::AllowMultipleReadWithConnection,
    }],
};

pub static CONNECTION_INVITATION_REQUEST: ObjectSchema = ObjectSchema {
    name: "ConnectionInvitationRequest",
    description: "Requests a pairwise connection through an invitation.",
    fields: &[
        field(
            "organization_name",
            FieldType::String,
            true,
            "Name of the organization involved.",
        ),
        field(
            "allow_multiple_read",
            FieldType::Boolean,
            false,
            "true: the request can be used several times. (The spec also calls it usable only \
             without connection_id, a field this body does not have.)",
        ),
        REQUEST_UID,
    ],
    constraints: &[],
};

pub static CREDENTIAL_ATTRIBUTE_PREVIEW: ObjectSchema = ObjectSchema {
    name: "CredentialAttributePreview",
    description: "One attribute of a credential offer.",
    fields: &[
        field("name", FieldType::String, true, "Attribute name."),
        field(
            "mime_type",
            FieldType::String,
            true,
            "MIME type of the value.",
        ),
        field("value", FieldType::String, true, "Attribute value."),
    ],
    constraints: &[],
};

pub static CREDENTIAL_OFFER_REQUEST: ObjectSchema = ObjectSchema {
    name: "CredentialOfferRequest",
    description: "Sends a credential offer, optionally addressed to an existing connection.",
    fields: &[
        field(
            "organization_name",
            FieldType::String,
            true,
            "Name of the organization involved.",
        ),
        field(
            "credential_def_id",
            FieldType::String,
            true,
            "Identifier of the credential definition to offer.",
        ),
        REQUEST_UID,
        field(
            "connection_id",
            FieldType::String,
            false,
            "Connection to which the offer is sent.",
        ),
        field(
            "credential_values",
            FieldType::ArrayOf(&CREDENTIAL_ATTRIBUTE_PREVIEW),
            false,
            "Attributes to offer. Mandatory when connection_id is given.",
        ),
        field(
            "comment",
            FieldType::String,
            false,
            "Description of the operation shown to the user.",
        ),
    ],
    constraints: &[Constraint::Requires {
        when: "connection_id",
        then: "credential_values",
        rule: Rule::CredentialValuesRequired,
    }],
};

pub static SERVICE_DESCRIPTION: ObjectSchema = ObjectSchema {
    name: "ServiceDescription",
    description: "A localized description.",
    fields: &[
        field("lang", FieldType::String, true, "Language of the message."),
        field("message", FieldType::String, true, "The message."),
    ],
    constraints: &[],
};

pub static VERIFY_RESPONSE_REQUEST: ObjectSchema = ObjectSchema {
    name: "VerifyResponseRequest",
    description: "Sends the response to a previously executed verify request, identified by \
                  presentation_id.",
    fields: &[
        field(
            "presentation_id",
            FieldType::String,
            false,
            "Presentation identifier of the verify request concerned.",
        ),
        field(
            "result",
            FieldType::Boolean,
            false,
            "true if the verification succeeded, false otherwise.",
        ),
        field(
            "descriptions",
            FieldType::ArrayOf(&SERVICE_DESCRIPTION),
            false,
            "Localized descriptions of the verify response.",
        ),
    ],
    constraints: &[],
};

/// The request body schemas, one per operation that takes a body.
pub static REQUEST_SCHEMAS: [&ObjectSchema; 4] = [
    &VERIFY_REQUEST,
    &VERIFY_RESPONSE_REQUEST,
    &CONNECTION_INVITATION_REQUEST,
    &CREDENTIAL_OFFER_REQUEST,
];

/// The schema of `operation`'s request body; `None` for the bodiless transaction status.
pub fn request_schema(operation: Operation) -> Option<&'static ObjectSchema> {
    match operation {
        Operation::VerifyRequest => Some(&VERIFY_REQUEST),
        Operation::VerifyResponse => Some(&VERIFY_RESPONSE_REQUEST),
        Operation::ConnectionInvitation => Some(&CONNECTION_INVITATION_REQUEST),
        Operation::CredentialOffer => Some(&CREDENTIAL_OFFER_REQUEST),
        Operation::TransactionStatus => None,
    }
}

/// Every object schema: the request bodies, then the item schemas they use, each once.
pub fn all_schemas() -> Vec<&'static ObjectSchema> {
    let mut out: Vec<&'static ObjectSchema> = REQUEST_SCHEMAS.to_vec();
    let mut i = 0;
    while i < out.len() {
        for item in out[i].item_schemas() {
            if !out.iter().any(|s| s.name == item.name) {
                out.push(item);
            }
        }
        i += 1;
    }
    out
}

/// A body rule that a request broke. A small fixed set: it is a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Not UTF-8 JSON, or text after the value.
    NotJson,
    /// JSON, but not an object.
    NotObject,
    /// A required field is absent or `null`.
    Required,
    /// A field has another JSON type than declared.
    Type,
    /// A declared field appears twice in one object.
    Duplicate,
    /// A required field of an array item is absent or `null`.
    ItemRequired,
    /// An array item is not an object, or one of its fields has the wrong type.
    ItemType,
    /// Spec rule 2: create_verify_request's allow_multiple_read together with connection_id.
    AllowMultipleReadWithConnection,
    /// Spec rule 3: create_credentil_offer's connection_id without credential_values.
    CredentialValuesRequired,
}

impl Rule {
    /// Every rule, for pre-resolving metric label values.
    pub const ALL: [Rule; 9] = [
        Rule::NotJson,
        Rule::NotObject,
        Rule::Required,
        Rule::Type,
        Rule::Duplicate,
        Rule::ItemRequired,
        Rule::ItemType,
        Rule::AllowMultipleReadWithConnection,
        Rule::CredentialValuesRequired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rule::NotJson => "not_json",
            Rule::NotObject => "not_object",
            Rule::Required => "required",
            Rule::Type => "type",
            Rule::Duplicate => "duplicate",
            Rule::ItemRequired => "item_required",
            Rule::ItemType => "item_type",
            Rule::AllowMultipleReadWithConnection => "allow_multiple_read_with_connection",
            Rule::CredentialValuesRequired => "credential_values_required",
        }
    }
}

/// Why a body is invalid: the field (a JSON path such as `credential_values[0].name`, empty
/// for the body as a whole) and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub rule: Rule,
}

impl Violation {
    fn at(path: &Path<'_>, rule: Rule) -> Self {
        let mut field = String::new();
        path.render(&mut field);
        Violation { field, rule }
    }

    /// One sentence for the 400 answer's `message`, naming the field and the rule label
    /// (`credential_values[2].mime_type is required (rule item_required)`).
    pub fn message(&self) -> String {
        let f = &self.field;
        let what = match self.rule {
            Rule::NotJson => "the body is not valid UTF-8 JSON".to_owned(),
            Rule::NotObject => "the body is not a JSON object".to_owned(),
            Rule::Required | Rule::ItemRequired => format!("{f} is required"),
            Rule::Type | Rule::ItemType => format!("{f} must be {}", expected_noun(f)),
            Rule::Duplicate => format!("{f} is given more than once"),
            Rule::AllowMultipleReadWithConnection | Rule::CredentialValuesRequired => {
                match constraint_of(self.rule) {
                    Some(c) => c.sentence(),
                    None => format!("{f} breaks a cross-field rule"),
                }
            }
        };
        format!("{what} (rule {})", self.rule.as_str())
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for Violation {}

/// What a field at `path` must be, from its last name (a field name has one type in every
/// schema; a test holds this) or, for a path ending in an index, an object.
fn expected_noun(path: &str) -> &'static str {
    if path.ends_with(']') {
        return "an object";
    }
    let leaf = path.rsplit('.').next().unwrap_or(path);
    all_schemas()
        .iter()
        .flat_map(|s| s.fields)
        .find(|f| f.name == leaf)
        .map_or("of its declared type", |f| f.ty.noun())
}

fn constraint_of(rule: Rule) -> Option<Constraint> {
    all_schemas()
        .iter()
        .flat_map(|s| s.constraints)
        .copied()
        .find(|c| c.rule() == rule)
}

/// Checks `body` against the schema of `operation`'s request body. The transaction status
/// has no body: anything passes.
pub fn validate(operation: Operation, body: &[u8]) -> Result<(), Violation> {
    let Some(schema) = request_schema(operation) else {
        return Ok(());
    };
    let root = Path::ROOT;
    let not_json = || Violation::at(&root, Rule::NotJson);
    // Strings serde_json skips are not checked for UTF-8; checking the whole body first makes
    // skipped fields as strict as read ones.
    let text = std::str::from_utf8(body).map_err(|_| not_json())?;
    let mut de = serde_json::Deserializer::from_str(text);
    let found = ObjectSeed {
        schema,
        path: Path::ROOT,
    }
    .deserialize(&mut de)
    .and_then(|found| de.end().map(|()| found))
    .map_err(|_| not_json())?;
    match found {
        None => Ok(()),
        Some(v) => Err(v),
    }
}

/// Where a value sits in the body, as a chain of borrowed segments: rendered into a string
/// only when a violation is found.
#[derive(Clone, Copy)]
struct Path<'p> {
    parent: Option<&'p Path<'p>>,
    seg: Seg,
}

#[derive(Clone, Copy)]
enum Seg {
    Root,
    Field(&'static str),
    Index(usize),
}

impl<'p> Path<'p> {
    const ROOT: Path<'static> = Path {
        parent: None,
        seg: Seg::Root,
    };

    fn is_root(&self) -> bool {
        self.parent.is_none()
    }

    fn child(&'p self, seg: Seg) -> Path<'p> {
        Path {
            parent: Some(self),
            seg,
        }
    }

    fn render(&self, out: &mut String) {
        if let Some(p) = self.parent {
            p.render(out);
        }
        match self.seg {
            Seg::Root => {}
            Seg::Field(name) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            }
            Seg::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
        }
    }
}

/// The JSON type of a value, as far as the validator cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

/// What to do with one JSON value: arrays and objects may be walked, anything else (or an
/// unwalked array or object, skipped whole) is judged by its [`Shape`].
trait Probe<'de>: Sized {
    type Out;

    fn other(self, shape: Shape) -> Self::Out;

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Out, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(self.other(Shape::Array))
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Out, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(self.other(Shape::Object))
    }
}

/// Adapts a [`Probe`] to serde: every JSON value reaches the probe, none is a serde error.
struct ProbeVisitor<P>(P);

impl<'de, P: Probe<'de>> Visitor<'de> for ProbeVisitor<P> {
    type Value = P::Out;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<P::Out, E> {
        Ok(self.0.other(Shape::Null))
    }

    fn visit_bool<E>(self, _: bool) -> Result<P::Out, E> {
        Ok(self.0.other(Shape::Bool))
    }

    fn visit_i64<E>(self, _: i64) -> Result<P::Out, E> {
        Ok(self.0.other(Shape::Number))
    }

    fn visit_u64<E>(self, _: u64) -> Result<P::Out, E> {
        Ok(self.0.other(Shape::Number))
    }

    fn visit_f64<E>(self, _: f64) -> Result<P::Out, E> {
        Ok(self.0.other(Shape::Number))
    }

    fn visit_str<E>(self, _: &str) -> Result<P::Out, E> {
        Ok(self.0.other(Shape::String))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<P::Out, A::Error> {
        self.0.seq(seq)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<P::Out, A::Error> {
        self.0.map(map)
    }
}

/// Runs a [`Probe`] over the next value of a deserializer.
struct Run<P>(P);

impl<'de, P: Probe<'de>> DeserializeSeed<'de> for Run<P> {
    type Value = P::Out;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<P::Out, D::Error> {
        d.deserialize_any(ProbeVisitor(self.0))
    }
}

/// Only the shape of a value.
struct ShapeOf;

impl Probe<'_> for ShapeOf {
    type Out = Shape;

    fn other(self, shape: Shape) -> Shape {
        shape
    }
}

/// The first violation found in a value, if any.
type Found = Option<Violation>;

/// A value that must be an object of `schema`: the body itself, or an array item.
struct ObjectSeed<'p> {
    schema: &'static ObjectSchema,
    path: Path<'p>,
}

impl ObjectSeed<'_> {
    /// Array items break `item_*` rules, the body the plain ones.
    fn rule(&self, body: Rule, item: Rule) -> Rule {
        if self.path.is_root() {
            body
        } else {
            item
        }
    }
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_> {
    type Value = Found;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Found, D::Error> {
        Run(self).deserialize(d)
    }
}

impl<'de> Probe<'de> for ObjectSeed<'_> {
    type Out = Found;

    fn other(self, _: Shape) -> Found {
        Some(Violation::at(
            &self.path,
            self.rule(Rule::NotObject, Rule::ItemType),
        ))
    }

    fn map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let fields = self.schema.fields;
        // One bit per declared field: given at all, and given with a non-null value.
        let mut seen = 0u64;
        let mut present = 0u64;
        let mut found: Found = None;
        while let Some(key) = map.next_key_seed(KeySeed(self.schema))? {
            let Some(i) = key else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            let f = &fields[i];
            let bit = 1u64 << i;
            let path = self.path.child(Seg::Field(f.name));
            if seen & bit != 0 {
                map.next_value::<IgnoredAny>()?;
                found.get_or_insert_with(|| Violation::at(&path, Rule::Duplicate));
                continue;
            }
            seen |= bit;
            let outcome = match f.ty {
                FieldType::ArrayOf(items) => {
                    map.next_value_seed(Run(ArrayOf { items, path: &path }))?
                }
                FieldType::String => match map.next_value_seed(Run(ShapeOf))? {
                    Shape::String => Ok(None),
                    other => Err(other),
                },
                FieldType::Boolean => match map.next_value_seed(Run(ShapeOf))? {
                    Shape::Bool => Ok(None),
                    other => Err(other),
                },
            };
            match outcome {
                // An explicit null is an absent field.
                Err(Shape::Null) => {}
                Err(_) => {
                    present |= bit;
                    let rule = self.rule(Rule::Type, Rule::ItemType);
                    found.get_or_insert_with(|| Violation::at(&path, rule));
                }
                Ok(inner) => {
                    present |= bit;
                    if let Some(v) = inner {
                        found.get_or_insert(v);
                    }
                }
            }
        }
        if found.is_some() {
            return Ok(found);
        }
        for (i, f) in fields.iter().enumerate() {
            if f.required && present & (1u64 << i) == 0 {
                let path = self.path.child(Seg::Field(f.name));
                return Ok(Some(Violation::at(
                    &path,
                    self.rule(Rule::Required, Rule::ItemRequired),
                )));
            }
        }
        let is_present = |name| {
            self.schema
                .index(name)
                .is_some_and(|i| present & (1u64 << i) != 0)
        };
        for &c in self.schema.constraints {
            let broken = match c {
                Constraint::Requires { when, then, .. } => is_present(when) && !is_present(then),
                Constraint::Excludes { when, then, .. } => is_present(when) && is_present(then),
            };
            if broken {
                let path = self.path.child(Seg::Field(c.field()));
                return Ok(Some(Violation::at(&path, c.rule())));
            }
        }
        Ok(None)
    }
}

/// A field declared as an array of `items` objects. Walks an array and yields its first
/// violation; any other value comes back as its shape.
struct ArrayOf<'p> {
    items: &'static ObjectSchema,
    path: &'p Path<'p>,
}

impl<'de> Probe<'de> for ArrayOf<'_> {
    type Out = Result<Found, Shape>;

    fn other(self, shape: Shape) -> Self::Out {
        Err(shape)
    }

    fn seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Out, A::Error> {
        let mut found: Found = None;
        let mut i = 0;
        loop {
            let item = ObjectSeed {
                schema: self.items,
                path: self.path.child(Seg::Index(i)),
            };
            match seq.next_element_seed(item)? {
                None => return Ok(Ok(found)),
                Some(Some(v)) => {
                    found.get_or_insert(v);
                }
                Some(None) => {}
            }
            i += 1;
        }
    }
}

/// An object key: the index of the declared field it names, or `None`. Never copied.
struct KeySeed(&'static ObjectSchema);

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for KeySeed {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E>(self, key: &str) -> Result<Option<usize>, E> {
        Ok(self.0.index(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Map, Value};

    fn check(op: Operation, body: Value) -> Result<(), Violation> {
        validate(op, body.to_string().as_bytes())
    }

    fn fails(op: Operation, body: Value, field: &str, rule: Rule) {
        let text = body.to_string();
        assert_eq!(
            validate(op, text.as_bytes()),
            Err(Violation {
                field: field.to_owned(),
                rule
            }),
            "{text}"
        );
    }

    fn offer_item() -> Value {
        json!({"name": "age", "mime_type": "text/plain", "value": "42"})
    }

    #[test]
    fn minimal_valid_bodies_pass() {
        assert_eq!(
            check(Operation::VerifyRequest, json!({"business_code": "KYC"})),
            Ok(())
        );
        assert_eq!(check(Operation::VerifyResponse, json!({})), Ok(()));
        assert_eq!(
            check(
                Operation::ConnectionInvitation,
                json!({"organization_name": "Org"})
            ),
            Ok(())
        );
        assert_eq!(
            check(
                Operation::CredentialOffer,
                json!({"organization_name": "Org", "credential_def_id": "d"})
            ),
            Ok(())
        );
    }

    #[test]
    fn full_valid_bodies_pass() {
        let bodies = [
            (
                Operation::VerifyRequest,
                json!({"business_code": "b", "allow_multiple_read": true, "request_uid": "u"}),
            ),
            (
                Operation::VerifyRequest,
                json!({"business_code": "b", "connection_id": "c", "request_uid": "u"}),
            ),
            (
                Operation::VerifyResponse,
                json!({"presentation_id": "p", "result": false,
                       "descriptions": [{"lang": "en", "message": "ok"}, {"lang": "fr", "message": ""}]}),
            ),
            (
                Operation::ConnectionInvitation,
                json!({"organization_name": "o", "allow_multiple_read": false, "request_uid": "u"}),
            ),
            (
                Operation::CredentialOffer,
                json!({"organization_name": "o", "credential_def_id": "d", "request_uid": "u",
                       "connection_id": "c", "credential_values": [offer_item()], "comment": "hi"}),
            ),
        ];
        for (op, body) in bodies {
            assert_eq!(check(op, body.clone()), Ok(()), "{body}");
        }
    }

    #[test]
    fn transaction_status_takes_anything() {
        assert_eq!(validate(Operation::TransactionStatus, b""), Ok(()));
        assert_eq!(validate(Operation::TransactionStatus, b"\xff{"), Ok(()));
    }

    #[test]
    fn not_json() {
        for body in [
            &b""[..],
            b"   ",
            b"{",
            b"{\"business_code\":\"x\"",
            b"{\"business_code\":\"x\"} {}",
            b"{\"business_code\":\"x\"},",
            b"{'business_code':'x'}",
            b"{\"business_code\":\"x\",}",
            b"\xef\xbb\xbf{\"business_code\":\"x\"}",
            // Invalid UTF-8 inside a skipped, undeclared field.
            b"{\"business_code\":\"x\",\"extra\":\"\xff\"}",
            // A syntax error after a type violation still makes the body not JSON.
            b"{\"business_code\":5,",
        ] {
            let got = validate(Operation::VerifyRequest, body).unwrap_err();
            assert_eq!(
                got.rule,
                Rule::NotJson,
                "{:?}",
                String::from_utf8_lossy(body)
            );
            assert_eq!(got.field, "");
        }
    }

    #[test]
    fn not_object() {
        for body in [
            "[]",
            "[{\"business_code\":\"x\"}]",
            "\"x\"",
            "1",
            "null",
            "true",
        ] {
            for op in [Operation::VerifyRequest, Operation::CredentialOffer] {
                assert_eq!(
                    validate(op, body.as_bytes()),
                    Err(Violation {
                        field: String::new(),
                        rule: Rule::NotObject
                    }),
                    "{body}"
                );
            }
        }
    }

    #[test]
    fn required_fields() {
        fails(
            Operation::VerifyRequest,
            json!({}),
            "business_code",
            Rule::Required,
        );
        fails(
            Operation::ConnectionInvitation,
            json!({"allow_multiple_read": true}),
            "organization_name",
            Rule::Required,
        );
        fails(
            Operation::CredentialOffer,
            json!({"organization_name": "o"}),
            "credential_def_id",
            Rule::Required,
        );
        // Missing fields are reported in schema order.
        fails(
            Operation::CredentialOffer,
            json!({}),
            "organization_name",
            Rule::Required,
        );
    }

    #[test]
    fn null_is_absent() {
        // Optional: accepted, and does not count as present for the cross-field rules.
        assert_eq!(
            check(
                Operation::VerifyRequest,
                json!({"business_code": "b", "connection_id": null, "allow_multiple_read": true,
                       "request_uid": null})
            ),
            Ok(())
        );
        assert_eq!(
            check(
                Operation::CredentialOffer,
                json!({"organization_name": "o", "credential_def_id": "d",
                       "connection_id": null, "credential_values": null})
            ),
            Ok(())
        );
        // Required: missing.
        fails(
            Operation::VerifyRequest,
            json!({"business_code": null}),
            "business_code",
            Rule::Required,
        );
        fails(
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d",
                   "credential_values": [{"name": "n", "mime_type": null, "value": "v"}]}),
            "credential_values[0].mime_type",
            Rule::ItemRequired,
        );
    }

    #[test]
    fn declared_types() {
        fails(
            Operation::VerifyRequest,
            json!({"business_code": 7}),
            "business_code",
            Rule::Type,
        );
        fails(
            Operation::VerifyRequest,
            json!({"business_code": "b", "allow_multiple_read": "true"}),
            "allow_multiple_read",
            Rule::Type,
        );
        fails(
            Operation::VerifyResponse,
            json!({"result": 1}),
            "result",
            Rule::Type,
        );
        fails(
            Operation::VerifyResponse,
            json!({"descriptions": {"lang": "en", "message": "m"}}),
            "descriptions",
            Rule::Type,
        );
        fails(
            Operation::CredentialOffer,
            json!({"organization_name": ["o"], "credential_def_id": "d"}),
            "organization_name",
            Rule::Type,
        );
        fails(
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d", "comment": {}}),
            "comment",
            Rule::Type,
        );
    }

    #[test]
    fn the_first_wrong_field_in_document_order_is_reported() {
        let body = br#"{"result": 1, "presentation_id": 2}"#;
        assert_eq!(
            validate(Operation::VerifyResponse, body).unwrap_err().field,
            "result"
        );
        // A wrong type is reported before a missing required field.
        let body = br#"{"request_uid": 1}"#;
        assert_eq!(
            validate(Operation::VerifyRequest, body).unwrap_err(),
            Violation {
                field: "request_uid".into(),
                rule: Rule::Type
            }
        );
    }

    #[test]
    fn array_items() {
        let offer = |items: Value| json!({"organization_name": "o", "credential_def_id": "d", "credential_values": items});
        fails(
            Operation::CredentialOffer,
            offer(json!([offer_item(), {"name": "n", "value": "v"}])),
            "credential_values[1].mime_type",
            Rule::ItemRequired,
        );
        fails(
            Operation::CredentialOffer,
            offer(json!([offer_item(), offer_item(), {"name": "n", "mime_type": 3, "value": "v"}])),
            "credential_values[2].mime_type",
            Rule::ItemType,
        );
        fails(
            Operation::CredentialOffer,
            offer(json!(["age"])),
            "credential_values[0]",
            Rule::ItemType,
        );
        fails(
            Operation::CredentialOffer,
            offer(json!([null])),
            "credential_values[0]",
            Rule::ItemType,
        );
        fails(
            Operation::VerifyResponse,
            json!({"descriptions": [{"lang": "en"}]}),
            "descriptions[0].message",
            Rule::ItemRequired,
        );
        fails(
            Operation::VerifyResponse,
            json!({"descriptions": [{"lang": false, "message": "m"}]}),
            "descriptions[0].lang",
            Rule::ItemType,
        );
        // Unknown fields in items are allowed; an empty array is an array.
        assert_eq!(
            check(
                Operation::VerifyResponse,
                json!({"descriptions": [{"lang": "en", "message": "m", "extra": [1, {}]}]})
            ),
            Ok(())
        );
        assert_eq!(check(Operation::CredentialOffer, offer(json!([]))), Ok(()));
    }

    #[test]
    fn rule_2_allow_multiple_read_only_without_connection() {
        for amr in [true, false] {
            fails(
                Operation::VerifyRequest,
                json!({"business_code": "b", "connection_id": "c", "allow_multiple_read": amr}),
                "allow_multiple_read",
                Rule::AllowMultipleReadWithConnection,
            );
        }
        assert_eq!(
            check(
                Operation::VerifyRequest,
                json!({"business_code": "b", "allow_multiple_read": false})
            ),
            Ok(())
        );
        // The invitation body has no connection_id; an undeclared one changes nothing.
        assert_eq!(
            check(
                Operation::ConnectionInvitation,
                json!({"organization_name": "o", "connection_id": "c", "allow_multiple_read": true})
            ),
            Ok(())
        );
    }

    #[test]
    fn rule_3_credential_values_with_connection() {
        fails(
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d", "connection_id": "c"}),
            "credential_values",
            Rule::CredentialValuesRequired,
        );
        fails(
            Operation::CredentialOffer,
            json!({"organization_name": "o", "credential_def_id": "d", "connection_id": "c",
                   "credential_values": null}),
            "credential_values",
            Rule::CredentialValuesRequired,
        );
        // Without connection_id credential_values stays optional.
        assert_eq!(
            check(
                Operation::CredentialOffer,
                json!({"organization_name": "o", "credential_def_id": "d"})
            ),
            Ok(())
        );
    }

    #[test]
    fn duplicate_declared_fields() {
        let body = br#"{"business_code": 1, "business_code": "b"}"#;
        // The wrong first copy is reported first; a second copy of a good one is a duplicate.
        assert_eq!(
            validate(Operation::VerifyRequest, body).unwrap_err().rule,
            Rule::Type
        );
        let body = br#"{"business_code": "a", "business_code": "b"}"#;
        assert_eq!(
            validate(Operation::VerifyRequest, body),
            Err(Violation {
                field: "business_code".into(),
                rule: Rule::Duplicate
            })
        );
        let body = br#"{"business_code": "a", "business\u005fcode": "b"}"#;
        assert_eq!(
            validate(Operation::VerifyRequest, body).unwrap_err().rule,
            Rule::Duplicate
        );
        let body = br#"{"descriptions": [{"lang": "a", "message": "m", "lang": "b"}]}"#;
        assert_eq!(
            validate(Operation::VerifyResponse, body),
            Err(Violation {
                field: "descriptions[0].lang".into(),
                rule: Rule::Duplicate
            })
        );
        // Undeclared keys may repeat.
        let body = br#"{"business_code": "a", "x": 1, "x": 2}"#;
        assert_eq!(validate(Operation::VerifyRequest, body), Ok(()));
    }

    #[test]
    fn unpaired_surrogates_are_refused_only_where_read() {
        let body = br#"{"business_code": "b", "x": "\ud800"}"#;
        assert_eq!(validate(Operation::VerifyRequest, body), Ok(()));
        let body = br#"{"business_code": "\ud800"}"#;
        assert_eq!(
            validate(Operation::VerifyRequest, body).unwrap_err().rule,
            Rule::NotJson
        );
    }

    #[test]
    fn escaped_keys_and_values_are_read_as_json() {
        let body = br#"{"business\u005fcode": "\u004b\"YC"}"#;
        assert_eq!(validate(Operation::VerifyRequest, body), Ok(()));
    }

    #[test]
    fn deep_nesting_is_skipped_without_overflow() {
        // Only the schema's own few levels are walked; anything deeper is skipped by
        // serde_json without recursion, wherever it sits.
        let deep = "[".repeat(200_000) + &"]".repeat(200_000);
        let body = format!(r#"{{"business_code":"b","x":{deep}}}"#);
        assert_eq!(validate(Operation::VerifyRequest, body.as_bytes()), Ok(()));
        let body = format!(r#"{{"business_code":{deep}}}"#);
        assert_eq!(
            validate(Operation::VerifyRequest, body.as_bytes()),
            Err(Violation {
                field: "business_code".into(),
                rule: Rule::Type
            })
        );
        let body = format!(r#"{{"descriptions":[{{"lang":{deep}}}]}}"#);
        assert_eq!(
            validate(Operation::VerifyResponse, body.as_bytes()),
            Err(Violation {
                field: "descriptions[0].lang".into(),
                rule: Rule::ItemType
            })
        );
        let body = format!(r#"{{"descriptions":{deep}}}"#);
        assert_eq!(
            validate(Operation::VerifyResponse, body.as_bytes()),
            Err(Violation {
                field: "descriptions[0]".into(),
                rule: Rule::ItemType
            })
        );
        // Unbalanced: not JSON, still no overflow.
        let body = format!(r#"{{"business_code":"b","x":{}}}"#, "[".repeat(200_000));
        assert_eq!(
            validate(Operation::VerifyRequest, body.as_bytes())
                .unwrap_err()
                .rule,
            Rule::NotJson
        );
    }

    #[test]
    fn a_large_body_is_validated() {
        let items: Vec<Value> = (0..20_000).map(|_| offer_item()).collect();
        let body = json!({"organization_name": "o", "credential_def_id": "d",
                          "connection_id": "c", "credential_values": items, "pad": "x".repeat(100_000)});
        let text = body.to_string();
        assert!(text.len() > 1_000_000);
        assert_eq!(
            validate(Operation::CredentialOffer, text.as_bytes()),
            Ok(())
        );
    }

    #[test]
    fn messages_name_field_and_rule() {
        let cases = [
            (
                "",
                Rule::NotJson,
                "the body is not valid UTF-8 JSON (rule not_json)",
            ),
            (
                "business_code",
                Rule::Required,
                "business_code is required (rule required)",
            ),
            (
                "allow_multiple_read",
                Rule::Type,
                "allow_multiple_read must be a boolean (rule type)",
            ),
            (
                "credential_values",
                Rule::Type,
                "credential_values must be an array of objects (rule type)",
            ),
            (
                "credential_values[2].mime_type",
                Rule::ItemType,
                "credential_values[2].mime_type must be a string (rule item_type)",
            ),
            (
                "credential_values[2]",
                Rule::ItemType,
                "credential_values[2] must be an object (rule item_type)",
            ),
            (
                "allow_multiple_read",
                Rule::AllowMultipleReadWithConnection,
                "allow_multiple_read may only be used without connection_id \
                 (rule allow_multiple_read_with_connection)",
            ),
            (
                "credential_values",
                Rule::CredentialValuesRequired,
                "credential_values is required when connection_id is given \
                 (rule credential_values_required)",
            ),
        ];
        for (field, rule, want) in cases {
            let v = Violation {
                field: field.into(),
                rule,
            };
            assert_eq!(v.message(), want);
            assert_eq!(v.to_string(), want);
        }
        for rule in Rule::ALL {
            let m = Violation {
                field: "x".into(),
                rule,
            }
            .message();
            assert!(m.contains(rule.as_str()), "{m}");
        }
    }

    #[test]
    fn schema_tables_are_consistent() {
        let all = all_schemas();
        assert_eq!(all.len(), 6);
        let mut labels: Vec<&str> = Rule::ALL.iter().map(|r| r.as_str()).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), Rule::ALL.len());
        for s in &all {
            assert!(s.fields.len() <= 64, "{}", s.name);
            for (i, f) in s.fields.iter().enumerate() {
                assert_eq!(s.index(f.name), Some(i), "{}.{} twice", s.name, f.name);
                // expected_noun looks types up by name alone.
                for other in all.iter().flat_map(|o| o.fields) {
                    if other.name == f.name {
                        assert_eq!(other.ty.noun(), f.ty.noun(), "{}", f.name);
                    }
                }
            }
            for c in s.constraints {
                let (Constraint::Requires { when, then, .. }
                | Constraint::Excludes { when, then, .. }) = *c;
                assert!(s.index(when).is_some() && s.index(then).is_some());
                assert_eq!(constraint_of(c.rule()), Some(*c));
            }
        }
        for op in Operation::ALL {
            assert_eq!(
                request_schema(op).is_some(),
                op != Operation::TransactionStatus
            );
        }
    }

    // ---- Property tests ----

    /// All violations of `v` against `schema`, computed the obvious way over a parsed value: the
    /// model the streaming validator is checked against.
    fn model(schema: &ObjectSchema, v: &Value, path: &str, item: bool) -> Vec<Violation> {
        let at = |name: &str| {
            if path.is_empty() {
                name.to_owned()
            } else {
                format!("{path}.{name}")
            }
        };
        let viol = |field: String, rule| Violation { field, rule };
        let Some(obj) = v.as_object() else {
            let rule = if item {
                Rule::ItemType
            } else {
                Rule::NotObject
            };
            return vec![viol(path.to_owned(), rule)];
        };
        let (req, ty) = if item {
            (Rule::ItemRequired, Rule::ItemType)
        } else {
            (Rule::Required, Rule::Type)
        };
        let mut out = Vec::new();
        let present = |name: &str| obj.get(name).is_some_and(|v| !v.is_null());
        for f in schema.fields {
            match obj.get(f.name) {
                None | Some(Value::Null) => {
                    if f.required {
                        out.push(viol(at(f.name), req));
                    }
                }
                Some(v) => match (f.ty, v) {
                    (FieldType::String, Value::String(_)) => {}
                    (FieldType::Boolean, Value::Bool(_)) => {}
                    (FieldType::ArrayOf(items), Value::Array(a)) => {
                        for (i, e) in a.iter().enumerate() {
                            out.extend(model(items, e, &format!("{}[{i}]", at(f.name)), true));
                        }
                    }
                    _ => out.push(viol(at(f.name), ty)),
                },
            }
        }
        for c in schema.constraints {
            let broken = match *c {
                Constraint::Requires { when, then, .. } => present(when) && !present(then),
                Constraint::Excludes { when, then, .. } => present(when) && present(then),
            };
            if broken {
                out.push(viol(at(c.field()), c.rule()));
            }
        }
        out
    }

    fn any_op() -> impl Strategy<Value = Operation> {
        proptest::sample::select(Operation::ALL.to_vec())
    }

    fn body_op() -> impl Strategy<Value = Operation> {
        proptest::sample::select(
            Operation::ALL
                .iter()
                .copied()
                .filter(|op| request_schema(*op).is_some())
                .collect::<Vec<_>>(),
        )
    }

    /// Any JSON value, small.
    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z_]{1,6}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A field name no schema declares.
    fn unknown_name() -> impl Strategy<Value = String> {
        "[a-z_]{1,12}".prop_filter("undeclared", |n| {
            !all_schemas()
                .iter()
                .flat_map(|s| s.fields)
                .any(|f| f.name == n)
        })
    }

    fn good_value(ty: FieldType) -> BoxedStrategy<Value> {
        match ty {
            FieldType::String => any::<String>().prop_map(Value::String).boxed(),
            FieldType::Boolean => any::<bool>().prop_map(Value::Bool).boxed(),
            FieldType::ArrayOf(items) => proptest::collection::vec(valid_object(items), 0..4)
                .prop_map(Value::Array)
                .boxed(),
        }
    }

    /// An object that satisfies `schema`: required fields good, optional ones absent, null
    /// or good, undeclared extras, then the cross-field rules made to hold.
    fn valid_object(schema: &'static ObjectSchema) -> BoxedStrategy<Value> {
        let fields: Vec<BoxedStrategy<Option<Value>>> = schema
            .fields
            .iter()
            .map(|f| {
                if f.required {
                    good_value(f.ty).prop_map(Some).boxed()
                } else {
                    prop_oneof![
                        2 => Just(None),
                        1 => Just(Some(Value::Null)),
                        3 => good_value(f.ty).prop_map(Some),
                    ]
                    .boxed()
                }
            })
            .collect();
        let extras = proptest::collection::vec((unknown_name(), any_json()), 0..3);
        (fields, extras)
            .prop_map(move |(values, extras)| {
                let mut m = Map::new();
                for (k, v) in extras {
                    m.insert(k, v);
                }
                for (f, v) in schema.fields.iter().zip(values) {
                    if let Some(v) = v {
                        m.insert(f.name.to_owned(), v);
                    }
                }
                let present =
                    |m: &Map<String, Value>, n: &str| m.get(n).is_some_and(|v| !v.is_null());
                for c in schema.constraints {
                    match *c {
                        Constraint::Requires { when, then, .. } => {
                            if present(&m, when) && !present(&m, then) {
                                m.remove(when);
                            }
                        }
                        Constraint::Excludes { when, then, .. } => {
                            if present(&m, when) && present(&m, then) {
                                m.remove(then);
                            }
                        }
                    }
                }
                Value::Object(m)
            })
            .boxed()
    }

    /// A value of the wrong type for `ty`.
    fn bad_value(ty: FieldType) -> BoxedStrategy<Value> {
        let all = prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<bool>().prop_map(Value::Bool),
            ".{0,4}".prop_map(Value::String),
            Just(json!({})),
            Just(json!([])),
            Just(json!([1])),
        ];
        all.prop_filter("wrong type", move |v| {
            !matches!(
                (ty, v),
                (FieldType::String, Value::String(_))
                    | (FieldType::Boolean, Value::Bool(_))
                    | (FieldType::ArrayOf(_), Value::Array(_))
            )
        })
        .boxed()
    }

    /// An object shaped like `schema` where every field may be absent, null, good or wrong,
    /// and array items likewise: reaches every rule.
    fn shaped_object(schema: &'static ObjectSchema, depth: u32) -> BoxedStrategy<Value> {
        let fields: Vec<BoxedStrategy<Option<Value>>> = schema
            .fields
            .iter()
            .map(|f| {
                let good = match f.ty {
                    FieldType::ArrayOf(items) if depth > 0 => proptest::collection::vec(
                        prop_oneof![
                            3 => shaped_object(items, depth - 1),
                            1 => any_json(),
                        ],
                        0..3,
                    )
                    .prop_map(Value::Array)
                    .boxed(),
                    ty => good_value(ty),
                };
                prop_oneof![
                    2 => Just(None),
                    1 => Just(Some(Value::Null)),
                    4 => good.prop_map(Some),
                    1 => bad_value(f.ty).prop_map(Some),
                ]
                .boxed()
            })
            .collect();
        let extras = proptest::collection::vec((unknown_name(), any_json()), 0..2);
        (fields, extras)
            .prop_map(move |(values, extras)| {
                let mut m: Map<String, Value> = extras.into_iter().collect();
                for (f, v) in schema.fields.iter().zip(values) {
                    if let Some(v) = v {
                        m.insert(f.name.to_owned(), v);
                    }
                }
                Value::Object(m)
            })
            .boxed()
    }

    fn op_and_valid_body() -> impl Strategy<Value = (Operation, Value)> {
        body_op().prop_flat_map(|op| (Just(op), valid_object(request_schema(op).unwrap())))
    }

    /// An operation whose body has an array field, and a valid body where that array has
    /// at least one item.
    fn op_and_body_with_items() -> impl Strategy<Value = (Operation, Value, &'static str)> {
        let ops: Vec<(Operation, &'static Field)> = Operation::ALL
            .iter()
            .filter_map(|&op| Some((op, request_schema(op)?)))
            .flat_map(|(op, s)| {
                s.fields
                    .iter()
                    .filter(|f| matches!(f.ty, FieldType::ArrayOf(_)))
                    .map(move |f| (op, f))
            })
            .collect();
        proptest::sample::select(ops).prop_flat_map(|(op, f)| {
            let FieldType::ArrayOf(items) = f.ty else {
                unreachable!()
            };
            (
                valid_object(request_schema(op).unwrap()),
                proptest::collection::vec(valid_object(items), 1..4),
            )
                .prop_map(move |(mut body, items)| {
                    body[f.name] = Value::Array(items);
                    (op, body, f.name)
                })
        })
    }

    fn op_and_shaped_body() -> impl Strategy<Value = (Operation, Value)> {
        body_op().prop_flat_map(|op| (Just(op), shaped_object(request_schema(op).unwrap(), 2)))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn never_panics_on_bytes(op in any_op(), body in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Err(v) = validate(op, &body) {
                prop_assert!(!v.message().is_empty());
            }
        }

        #[test]
        fn never_panics_on_json_like_text(op in any_op(), body in r#"[{}\[\]":,a-z0-9 \\tnulrefs_.-]{0,64}"#) {
            let _ = validate(op, body.as_bytes());
        }

        #[test]
        fn any_json_agrees_with_the_model(op in body_op(), body in any_json()) {
            let schema = request_schema(op).unwrap();
            let want = model(schema, &body, "", false);
            match validate(op, body.to_string().as_bytes()) {
                Ok(()) => prop_assert!(want.is_empty(), "passed, model says {want:?}"),
                Err(v) => prop_assert!(want.contains(&v), "{v:?} not in {want:?}"),
            }
        }

        #[test]
        fn shaped_bodies_agree_with_the_model((op, body) in op_and_shaped_body()) {
            let schema = request_schema(op).unwrap();
            let want = model(schema, &body, "", false);
            match validate(op, body.to_string().as_bytes()) {
                Ok(()) => prop_assert!(want.is_empty(), "passed, model says {want:?}"),
                Err(v) => prop_assert!(want.contains(&v), "{v:?} not in {want:?}"),
            }
        }

        #[test]
        fn valid_bodies_pass((op, body) in op_and_valid_body(), pretty in any::<bool>()) {
            let text = if pretty {
                serde_json::to_string_pretty(&body).unwrap()
            } else {
                body.to_string()
            };
            prop_assert_eq!(validate(op, text.as_bytes()), Ok(()), "{}", text);
        }

        #[test]
        fn removing_a_required_field_fails_naming_it(
            (op, body) in op_and_valid_body(),
            pick in any::<proptest::sample::Index>(),
        ) {
            let schema = request_schema(op).unwrap();
            let required: Vec<&Field> = schema.fields.iter().filter(|f| f.required).collect();
            prop_assume!(!required.is_empty());
            let f = required[pick.index(required.len())];
            let mut body = body;
            body.as_object_mut().unwrap().remove(f.name);
            prop_assert_eq!(
                validate(op, body.to_string().as_bytes()),
                Err(Violation { field: f.name.to_owned(), rule: Rule::Required })
            );
        }

        #[test]
        fn removing_an_item_field_fails_naming_it(
            (op, body, array) in op_and_body_with_items(),
            pick in any::<proptest::sample::Index>(),
        ) {
            let FieldType::ArrayOf(items) = request_schema(op)
                .unwrap()
                .fields
                .iter()
                .find(|f| f.name == array)
                .unwrap()
                .ty
            else {
                unreachable!()
            };
            let mut targets = Vec::new();
            for i in 0..body[array].as_array().unwrap().len() {
                for f in items.fields.iter().filter(|f| f.required) {
                    targets.push((i, f.name));
                }
            }
            let (i, field) = targets[pick.index(targets.len())];
            let mut body = body;
            body[array][i].as_object_mut().unwrap().remove(field);
            prop_assert_eq!(
                validate(op, body.to_string().as_bytes()),
                Err(Violation { field: format!("{array}[{i}].{field}"), rule: Rule::ItemRequired })
            );
        }

        #[test]
        fn unknown_fields_never_change_the_verdict(
            (op, body) in op_and_shaped_body(),
            extras in proptest::collection::vec((unknown_name(), any_json()), 1..4),
        ) {
            let before = validate(op, body.to_string().as_bytes());
            let mut with = body;
            for (k, v) in extras {
                with.as_object_mut().unwrap().insert(k, v);
            }
            prop_assert_eq!(validate(op, with.to_string().as_bytes()), before);
        }

        #[test]
        fn non_objects_are_not_objects(op in body_op(), body in any_json()) {
            prop_assume!(!body.is_object());
            prop_assert_eq!(
                validate(op, body.to_string().as_bytes()).unwrap_err().rule,
                Rule::NotObject
            );
        }
    }
}
