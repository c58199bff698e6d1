//! JSON Schemas of the domain's text and number types, as their parsers accept them (the
//! MCP tools publish them; the REST API's OpenAPI document will too).

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

impl JsonSchema for super::Ident {
    fn schema_name() -> Cow<'static, str> {
        "Ident".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string", "minLength": 1, "maxLength": 64,
            "pattern": "^[A-Za-z0-9._:-]+$",
            "description": "An identifier: 1 to 64 letters, digits or -_.:"
        })
    }
}

impl JsonSchema for super::Quantity {
    fn schema_name() -> Cow<'static, str> {
        "Quantity".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "integer", "minimum": 1, "maximum": 1000000,
            "description": "Whole contracts"
        })
    }
}

/// Inlined, so that each use takes the generator's side: what a request may send, or
/// what a response prints (always a decimal string with at least two decimals).
impl JsonSchema for super::Price {
    fn schema_name() -> Cow<'static, str> {
        "Price".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        if *g.contract() == schemars::generate::Contract::Serialize {
            return json_schema!({
                "type": "string", "pattern": "^-?[0-9]+\\.[0-9]{2,}$",
                "description": "A decimal price in USD per barrel, as a string with at least two decimals"
            });
        }
        json_schema!({
            "anyOf": [
                { "type": "string", "pattern": super::PRICE_TEXT_PATTERN },
                { "const": 0 },
                { "type": "number", "minimum": super::MIN_PRICE_NUMBER, "maximum": super::MAX_PRICE_NUMBER },
                { "type": "number", "minimum": -super::MAX_PRICE_NUMBER, "maximum": -super::MIN_PRICE_NUMBER }
            ],
            "description": "A decimal price in USD per barrel: a string (\"68.45\") or a number on input, always a string on output; may be negative"
        })
    }
}

impl JsonSchema for super::IdempotencyKey {
    fn schema_name() -> Cow<'static, str> {
        "IdempotencyKey".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$",
            "description": "1 to 255 printable ASCII characters"
        })
    }
}
