//! The environment layer: `REDRIVE__SECTION__KEY` variables, librdkafka properties
//! (`REDRIVE__KAFKA__PROPERTIES__SASL_PASSWORD` is `sasl.password`) and `DATABASE_URL`.

use std::collections::HashMap;

use super::ConfigError;

/// Prefix of every redrive variable.
const PREFIX: &str = "REDRIVE__";
/// Prefix of the variables that set one librdkafka property each.
const PROPERTY_PREFIX: &str = "REDRIVE__KAFKA__PROPERTIES__";
/// The variable that `DATABASE_URL` stands in for when it is not set itself.
const DATABASE_URL_VAR: &str = "REDRIVE__DATABASE__URL";
/// librdkafka properties settable as strings whose names hold `_` (every other `_` in a
/// variable name stands for a `.`); the other such names in librdkafka's
/// CONFIGURATION.md are callbacks and pointers, set through its API only.
const UNDERSCORE_PROPERTIES: [&str; 2] = ["enabled_events", "log_level"];

/// The environment, split into what the `config` crate reads and the Kafka properties.
pub(super) struct EnvLayer {
    /// `REDRIVE__...` variables other than properties, with `DATABASE_URL` applied.
    pub vars: HashMap<String, String>,
    /// librdkafka properties by their dotted names.
    pub properties: Vec<(String, String)>,
    /// The variable that set `database.url`, if one did.
    pub database_url_var: Option<&'static str>,
}

impl EnvLayer {
    /// Reads `env`, or the process environment when `None`.
    pub fn read(env: Option<HashMap<String, String>>) -> Result<EnvLayer, ConfigError> {
        let env = match env {
            Some(env) => env,
            None => process_environment()?,
        };
        let mut vars = HashMap::new();
        let mut properties = Vec::new();
        let mut database_url = None;
        for (name, value) in env {
            if name == "DATABASE_URL" {
                database_url = Some(value);
            } else if let Some(property) = strip_prefix(&name, PROPERTY_PREFIX) {
                if property.is_empty() {
                    return Err(ConfigError::new(
                        name,
                        "names no property: write e.g. REDRIVE__KAFKA__PROPERTIES__SASL_PASSWORD",
                    ));
                }
                properties.push((property_name(property), value));
            } else if strip_prefix(&name, PREFIX).is_some() {
                vars.insert(name, value);
            }
        }
        let explicit = vars
            .keys()
            .any(|k| k.eq_ignore_ascii_case(DATABASE_URL_VAR));
        let database_url_var = match (explicit, database_url) {
            (true, _) => Some(DATABASE_URL_VAR),
            (false, Some(url)) => {
                vars.insert(DATABASE_URL_VAR.to_owned(), url);
                Some("DATABASE_URL")
            }
            (false, None) => None,
        };
        // Sorted, so that of two spellings of one property the outcome does not vary.
        properties.sort();
        Ok(EnvLayer {
            vars,
            properties,
            database_url_var,
        })
    }
}

/// The process's variables that redrive reads; a non-UTF-8 value is refused by name
/// (never shown).
fn process_environment() -> Result<HashMap<String, String>, ConfigError> {
    let mut env = HashMap::new();
    for (name, value) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if name != "DATABASE_URL" && strip_prefix(name, PREFIX).is_none() {
            continue;
        }
        let value = value
            .into_string()
            .map_err(|_| ConfigError::new(name, "the value is not valid UTF-8"))?;
        env.insert(name.to_owned(), value);
    }
    Ok(env)
}

/// `name` without `prefix`, compared case-insensitively like the `config` crate does.
fn strip_prefix<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let head = name.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &name[prefix.len()..])
}

/// The librdkafka name of a variable's property part: lower-cased, `_` becomes `.`,
/// except in the few names that hold `_` themselves.
fn property_name(var: &str) -> String {
    let lower = var.to_ascii_lowercase();
    if UNDERSCORE_PROPERTIES.contains(&lower.as_str()) {
        lower
    } else {
        lower.replace('_', ".")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn property_names_from_variables() {
        assert_eq!(property_name("SASL_PASSWORD"), "sasl.password");
        assert_eq!(property_name("ssl_key_password"), "ssl.key.password");
        assert_eq!(property_name("LOG_LEVEL"), "log_level");
        assert_eq!(property_name("ENABLED_EVENTS"), "enabled_events");
    }

    #[test]
    fn database_url_fills_in_only_when_the_redrive_variable_is_unset() {
        let layer = |pairs: &[(&str, &str)]| {
            let env = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            EnvLayer::read(Some(env)).unwrap().vars
        };
        let vars = layer(&[("DATABASE_URL", "a"), ("OTHER", "x")]);
        assert_eq!(vars.len(), 1);
        assert_eq!(vars[DATABASE_URL_VAR], "a");
        let vars = layer(&[("DATABASE_URL", "a"), ("redrive__database__url", "b")]);
        assert_eq!(vars.len(), 1);
        assert_eq!(vars["redrive__database__url"], "b");
    }
}
