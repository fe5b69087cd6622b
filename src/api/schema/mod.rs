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

/// Fields that several bodies declare alike.
const REQUEST_UID: Field = field(
    "request_uid",
    FieldType::String,
    false,
    "Identifier of the request; generated automatically when absent.",
);
const ORGANIZATION_NAME: Field = field(
    "organization_name",
    FieldType::String,
    true,
    "Name of the organization involved.",
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
        ORGANIZATION_NAME,
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
        ORGANIZATION_NAME,
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

/// The request body schemas, one per operation that takes a body (the operation table says
/// whose is whose).
pub static REQUEST_SCHEMAS: [&ObjectSchema; 4] = [
    &VERIFY_REQUEST,
    &VERIFY_RESPONSE_REQUEST,
    &CONNECTION_INVITATION_REQUEST,
    &CREDENTIAL_OFFER_REQUEST,
];

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

listed_enum! {
    /// A body rule that a request broke. A small fixed set: it is a metric label.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Rule {
        /// Not UTF-8 JSON, or text after the value.
        NotJson => "not_json",
        /// JSON, but not an object.
        NotObject => "not_object",
        /// A required field is absent or `null`.
        Required => "required",
        /// A field has another JSON type than declared.
        Type => "type",
        /// A declared field appears twice in one object.
        Duplicate => "duplicate",
        /// A required field of an array item is absent or `null`.
        ItemRequired => "item_required",
        /// An array item is not an object, or one of its fields has the wrong type.
        ItemType => "item_type",
        /// Spec rule 2: create_verify_request's allow_multiple_read together with connection_id.
        AllowMultipleReadWithConnection => "allow_multiple_read_with_connection",
        /// Spec rule 3: create_credentil_offer's connection_id without credential_values.
        CredentialValuesRequired => "credential_values_required",
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

/// Checks a request `body` against `schema`.
pub fn validate(schema: &'static ObjectSchema, body: &[u8]) -> Result<(), Violation> {
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
mod tests;
