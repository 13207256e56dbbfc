//! Job templates: a team's saved job requests, by name, and submitting one with only what
//! changes. A template is checked against the catalogue when it is saved, and the job made
//! from it is checked again, as any submission, when it is submitted.

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::{
    audit::record,
    jobs::{self, JobSpec, Submitted},
    Error, Precondition, Result,
};
use crate::{
    auth::{CatalogueVersion, Principal},
    db::{self, teams::TeamRow, templates::TemplateRow},
    domain::{FieldError, TemplateName},
    state::AppState,
};

/// The label a job submitted from a template carries: the template's name.
pub const TEMPLATE_LABEL: &str = "fairway.dev/template";

/// A saved template.
#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateView {
    pub name: String,
    /// The job's fields, as saved.
    #[schema(value_type = JobSpec)]
    pub spec: Value,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub updated_by: String,
    pub updated_at: DateTime<Utc>,
    /// Bumped on every change; the `ETag`.
    pub version: i64,
    /// What a job from it would be accepted despite (`wait_for_quota`), when it was saved.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<FieldError>,
}

impl From<TemplateRow> for TemplateView {
    fn from(r: TemplateRow) -> Self {
        Self {
            name: r.name,
            spec: r.spec.0,
            created_by: r.created_by,
            created_at: r.created_at,
            updated_by: r.updated_by,
            updated_at: r.updated_at,
            version: r.version,
            warnings: Vec::new(),
        }
    }
}

/// The template `name` of `team`; a name no template could have is not found either.
pub async fn get(state: &AppState, team: &TeamRow, name: &str) -> Result<TemplateRow> {
    let name = TemplateName::parse("template", name).map_err(|_| Error::NotFound("template"))?;
    db::templates::get(&state.db, team.id, name.as_str()).await?.ok_or(Error::NotFound("template"))
}

/// Saves `spec` as `team`'s template `name` (new, or replacing the one of that name) on
/// behalf of `principal`, audited. The spec must pass what a submission of it would (see
/// [`jobs::check`]); `created` tells whether the template is new.
pub async fn save(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    name: &str,
    precondition: &Precondition,
    spec: &JobSpec,
    version: CatalogueVersion,
) -> Result<(TemplateView, bool)> {
    let name = TemplateName::parse("template", name)?;
    let warnings = jobs::check(state, team.id, spec, version).await?;
    let stored = serde_json::to_value(spec).map_err(|e| Error::internal("writing a template", e))?;
    let mut tx = state.db.begin().await?;
    let before = db::templates::get_for_update(&mut tx, team.id, name.as_str()).await?;
    precondition.check(before.as_ref().map_or(0, |b| b.version))?;
    let row = db::templates::upsert(&mut tx, team.id, name.as_str(), &stored, &principal.actor()).await?;
    let object = format!("{}/{name}", team.name);
    let created = before.is_none();
    record(
        &mut tx,
        principal,
        "job_template.save",
        "job_template",
        &object,
        Some(team.id),
        before.map(TemplateView::from).as_ref(),
        Some(&TemplateView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok((TemplateView { warnings, ..row.into() }, created))
}

/// Deletes `team`'s template `name`, audited. Jobs submitted from it are not touched.
pub async fn delete(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    name: &str,
    precondition: &Precondition,
) -> Result<()> {
    let name = TemplateName::parse("template", name).map_err(|_| Error::NotFound("template"))?;
    let mut tx = state.db.begin().await?;
    let before =
        db::templates::get_for_update(&mut tx, team.id, name.as_str()).await?.ok_or(Error::NotFound("template"))?;
    precondition.check(before.version)?;
    db::templates::delete(&mut tx, team.id, name.as_str()).await?;
    record(
        &mut tx,
        principal,
        "job_template.delete",
        "job_template",
        &format!("{}/{name}", team.name),
        Some(team.id),
        Some(&TemplateView::from(before)),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Submits a job of `team` from its template `name` on behalf of `by`: the template's fields,
/// with `overrides` over them (any of the job's fields; `env` and `labels` add to the
/// template's), labelled [`TEMPLATE_LABEL`]. Checked as any submission, at the catalogue and
/// budgets of now; a field the overrides get wrong is named as the job's.
pub async fn submit(
    state: &AppState,
    team: &TeamRow,
    by: &str,
    name: &str,
    overrides: Map<String, Value>,
    version: CatalogueVersion,
    check: Option<db::jobs::WriteCheck>,
) -> Result<Submitted> {
    let spec = spec(state, team, name, overrides).await?;
    jobs::submit(state, team, by, spec, version, check).await
}

/// The job `team`'s template `name` makes with `overrides` (see [`submit`]), not yet checked
/// against the catalogue: what the portal previews and submits from a form opened from it.
pub async fn spec(state: &AppState, team: &TeamRow, name: &str, overrides: Map<String, Value>) -> Result<JobSpec> {
    let template = get(state, team, name).await?;
    spec_from(template.spec.0, &template.name, overrides)
}

/// The job a template makes with `overrides`: top-level fields replaced, `env` and `labels`
/// merged key by key, the template's label set last (it cannot be overridden).
fn spec_from(template: Value, name: &str, overrides: Map<String, Value>) -> Result<JobSpec> {
    let Value::Object(mut fields) = template else {
        // The column's check keeps an object there.
        return Err(Error::internal("reading a template", "its stored spec is not an object"));
    };
    for (key, value) in overrides {
        match (key.as_str(), fields.get_mut(&key), value) {
            ("env" | "labels", Some(Value::Object(kept)), Value::Object(added)) => kept.extend(added),
            (_, _, value) => {
                fields.insert(key, value);
            }
        }
    }
    let labels = fields.entry("labels").or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(labels) = labels {
        labels.insert(TEMPLATE_LABEL.to_owned(), Value::from(name));
    }
    serde_path_to_error::deserialize(Value::Object(fields)).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        // An unknown field is named by itself, whether serde's path reaches it or stops at
        // its parent.
        let unknown = message.strip_prefix("unknown field `").and_then(|rest| rest.split_once('`')).map(|(k, _)| k);
        let field = match (unknown, path.as_str()) {
            (Some(key), ".") => key.to_owned(),
            (Some(key), path) if path != key && !path.ends_with(&format!(".{key}")) => format!("{path}.{key}"),
            (_, ".") => "body".to_owned(),
            (_, path) => path.to_owned(),
        };
        let code = if unknown.is_some() { "unknown_field" } else { "invalid_value" };
        Error::field(FieldError::new(field, code, message))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn overrides(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("the tests pass objects"),
        }
    }

    #[test]
    fn overrides_replace_fields_and_add_to_the_templates_maps() {
        let template = json!({"name": "eval", "gpu_class": "h100-80gb", "image": "img:1", "replicas": 2,
                              "env": {"A": "1", "B": "2"}, "labels": {"project": "vision"}});
        let spec = spec_from(
            template,
            "nightly-eval",
            overrides(json!({"image": "img:2", "env": {"B": "3"}, "labels": {"run": "42"}})),
        )
        .unwrap();
        assert_eq!(spec.image, "img:2");
        assert_eq!(spec.replicas, 2);
        assert_eq!(spec.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(spec.env.get("B").map(String::as_str), Some("3"));
        assert_eq!(spec.labels.get("project").map(String::as_str), Some("vision"));
        assert_eq!(spec.labels.get("run").map(String::as_str), Some("42"));
        assert_eq!(spec.labels.get(TEMPLATE_LABEL).map(String::as_str), Some("nightly-eval"));
    }

    #[test]
    fn the_template_label_cannot_be_overridden() {
        let template = json!({"name": "eval", "gpu_class": "h100-80gb", "image": "img:1"});
        let spec = spec_from(template, "eval", overrides(json!({"labels": {TEMPLATE_LABEL: "other"}}))).unwrap();
        assert_eq!(spec.labels.get(TEMPLATE_LABEL).map(String::as_str), Some("eval"));
    }

    #[test]
    fn a_bad_override_is_named_by_its_field() {
        let template = json!({"name": "eval", "gpu_class": "h100-80gb", "image": "img:1"});
        let Err(Error::Validation(errors)) = spec_from(template.clone(), "eval", overrides(json!({"replicas": "two"})))
        else {
            panic!("a string for replicas must be refused");
        };
        assert_eq!(errors[0].field, "replicas");
        let Err(Error::Validation(errors)) = spec_from(template, "eval", overrides(json!({"nmae": "x"}))) else {
            panic!("an unknown field must be refused");
        };
        assert_eq!((errors[0].field.as_str(), errors[0].code.as_str()), ("nmae", "unknown_field"));
    }
}
