//! The TypeScript side of the boundary, declared once, here in Rust: the types every file of
//! the bindings shares.
//!
//! `index.d.ts` is generated from what wasm-bindgen writes for this crate
//! (`scripts/typings.mjs`): each export's rustdoc becomes its TSDoc, and each argument read as a
//! `JsValue` (so that a wrong value is one of distopt's named errors, never wasm-bindgen's plain
//! `Error`) is declared with the TypeScript type it accepts through one of the extern types
//! below (`typescript_type`; `Option<…>` of one is an optional argument). The records the module
//! returns are serde types serialized by serde-wasm-bindgen ([`to_js`]), their declarations
//! generated from the same types by tsify. What a generator cannot express (generic and
//! template-literal types, `init()`, the error type) is `npm/supplement.d.ts`, which names the
//! types used here.

use serde::Serialize;
use wasm_bindgen::prelude::*;

use super::boundary::JsResult;

#[wasm_bindgen]
extern "C" {
    /// A tensor as distopt reads it (`TensorInput`, npm/supplement.d.ts).
    #[wasm_bindgen(typescript_type = "TensorInput")]
    pub type TensorInputArg;

    /// A tensor, or `null` for a missing gradient.
    #[wasm_bindgen(typescript_type = "TensorInput | null")]
    pub type OptionalTensorArg;

    /// A list of tensors.
    #[wasm_bindgen(typescript_type = "readonly TensorInput[]")]
    pub type TensorListArg;

    /// A list of tensors, `null` where one is missing.
    #[wasm_bindgen(typescript_type = "readonly (TensorInput | null)[]")]
    pub type OptionalTensorListArg;

    /// `[rank][param]` tensors.
    #[wasm_bindgen(typescript_type = "readonly (readonly TensorInput[])[]")]
    pub type PerRankTensorsArg;

    /// `[rank][param]` tensors, `null` where one is missing.
    #[wasm_bindgen(typescript_type = "readonly (readonly (TensorInput | null)[])[]")]
    pub type PerRankOptionalTensorsArg;

    /// A whole number (a count, a rank, an index), checked by the module: a string, boolean,
    /// array or `null` is a `TypeError`.
    #[wasm_bindgen(typescript_type = "number")]
    pub type IntegerArg;

    /// A number; `"nan"`, `"inf"` and `"-inf"` are read as the golden JSON writes them.
    #[wasm_bindgen(typescript_type = "number | 'nan' | 'inf' | '-inf'")]
    pub type NumberArg;

    /// A boolean, checked by the module (`'no'` is a `TypeError`, not `true`).
    #[wasm_bindgen(typescript_type = "boolean")]
    pub type BooleanArg;

    /// A string, checked by the module.
    #[wasm_bindgen(typescript_type = "string")]
    pub type StringArg;

    /// A list of parameter indices.
    #[wasm_bindgen(typescript_type = "readonly number[]")]
    pub type IndexListArg;

    /// A state dict as `loadStateDict` reads it (`StateDictInput`, npm/supplement.d.ts).
    #[wasm_bindgen(typescript_type = "StateDictInput")]
    pub type StateDictArg;

    /// A `World` made by distopt.
    #[wasm_bindgen(typescript_type = "World")]
    pub type WorldArg;

    /// A `Replicas` made by distopt.
    #[wasm_bindgen(typescript_type = "Replicas")]
    pub type ReplicasArg;

    /// An `SGD`, `Adam` or `AdamW` made by distopt.
    #[wasm_bindgen(typescript_type = "AnyLocalOptimizer")]
    pub type AnyLocalOptimizerArg;

    /// A `PeriodicModelAverager` or `HierarchicalModelAverager` made by distopt.
    #[wasm_bindgen(typescript_type = "ModelAverager")]
    pub type ModelAveragerArg;

    /// A local optimizer class or its name, where ZeRO and `DistributedOptimizer` take one.
    #[wasm_bindgen(typescript_type = "'SGD' | 'Adam' | 'AdamW' | OptimizerClass")]
    pub type OptimizerClassArg;

    /// The local optimizer's keyword arguments (`SGDOptions` or `AdamOptions`).
    #[wasm_bindgen(typescript_type = "SGDOptions | AdamOptions")]
    pub type OptimizerOptionsArg;
}

/// `value` as a plain JS value through serde-wasm-bindgen: structs and maps become plain
/// objects, `Option::None` `null`, numbers JS numbers; a field kept as a `JsValue`
/// (`#[serde(with = "serde_wasm_bindgen::preserve")]`, typed-array data) passes as it is.
pub(crate) fn to_js<T: Serialize + ?Sized>(value: &T) -> JsResult<JsValue> {
    let serializer = serde_wasm_bindgen::Serializer::new()
        .serialize_missing_as_null(true)
        .serialize_maps_as_objects(true);
    value
        .serialize(&serializer)
        .map_err(|e| super::boundary::js_error(distopt::error::Error::runtime(e.to_string())))
}
