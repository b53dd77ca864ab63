//! Reading PromQL without a Prometheus: the selectors an expression uses (metric names
//! and label matchers) and what a duration looks like. Enough for the expressions this
//! repository ships (alert rules, the Grafana dashboard), whose syntax promtool checks;
//! not a parser.

use std::collections::BTreeSet;

/// A vector selector: `metric{label op "value", …}`, the metric or the braces optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: Option<String>,
    pub matchers: Vec<Matcher>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    pub label: String,
    /// `=`, `!=`, `=~` or `!~`.
    pub op: String,
    pub value: String,
}

/// Aggregation operators: followed by `(` or by `by (…)` / `without (…)`.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];
/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// The other words that are not metrics: binary operators, modifiers, constants.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// An expression as characters, with the position helpers the scan needs.
struct Scan<'a> {
    expr: &'a str,
    chars: Vec<char>,
}

impl Scan<'_> {
    fn at(&self, i: usize) -> Option<char> {
        self.chars.get(i).copied()
    }

    /// The first position from `i` where `keep` no longer holds.
    fn skip(&self, mut i: usize, keep: impl Fn(char) -> bool) -> usize {
        while self.at(i).is_some_and(&keep) {
            i += 1;
        }
        i
    }

    fn text(&self, from: usize, to: usize) -> String {
        self.chars[from..to].iter().collect()
    }

    /// The string literal opening at `open`: its content and the position after it.
    fn string(&self, open: usize) -> (String, usize) {
        let quote = self.chars[open];
        let mut content = String::new();
        let mut i = open + 1;
        while let Some(c) = self.at(i) {
            if c == quote {
                return (content, i + 1);
            }
            if c == '\\' && quote != '`' {
                i += 1;
            }
            content.extend(self.at(i));
            i += 1;
        }
        panic!("{}: unterminated string", self.expr)
    }

    /// The position after the bracket closing the one at `open`, strings skipped.
    fn closing(&self, open: usize) -> usize {
        let (opening, closing) = (
            self.chars[open],
            if self.chars[open] == '(' { ')' } else { ']' },
        );
        let mut depth = 0;
        let mut i = open;
        while let Some(c) = self.at(i) {
            if matches!(c, '"' | '\'' | '`') {
                i = self.string(i).1;
                continue;
            }
            if c == opening {
                depth += 1;
            } else if c == closing {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            i += 1;
        }
        panic!("{}: unbalanced {opening}", self.expr)
    }

    /// The matchers of the braces opening at `open`, and the position after them.
    fn matchers(&self, open: usize) -> (Vec<Matcher>, usize) {
        let mut matchers = Vec::new();
        let mut i = open + 1;
        loop {
            i = self.skip(i, |c| c.is_whitespace() || c == ',');
            match self.at(i) {
                Some('}') => return (matchers, i + 1),
                Some(c) if is_ident_start(c) => {}
                _ => panic!("{}: expected a label name at {i}", self.expr),
            }
            let end = self.skip(i, is_ident);
            let label = self.text(i, end);
            i = self.skip(end, char::is_whitespace);
            let op = ["=~", "!~", "!=", "="]
                .into_iter()
                .find(|op| self.text(i, (i + op.len()).min(self.chars.len())) == *op)
                .unwrap_or_else(|| panic!("{}: no matcher after {label}", self.expr));
            i = self.skip(i + op.len(), char::is_whitespace);
            assert!(
                matches!(self.at(i), Some('"' | '\'' | '`')),
                "{}: {label}{op} without a string",
                self.expr
            );
            let (value, end) = self.string(i);
            i = end;
            matchers.push(Matcher {
                label,
                op: op.to_owned(),
                value,
            });
        }
    }
}

/// Every vector selector of `expr`, in order: identifiers that are not a function, an
/// aggregation, a keyword or a label name, with their matchers, and bare `{…}`. Strings,
/// ranges (`[5m]`), numbers, comments and unsubstituted `$variables` are skipped.
pub fn selectors(expr: &str) -> Vec<Selector> {
    let scan = Scan {
        expr,
        chars: expr.chars().collect(),
    };
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(c) = scan.at(i) {
        if c == '#' {
            i = scan.skip(i, |c| c != '\n');
        } else if matches!(c, '"' | '\'' | '`') {
            i = scan.string(i).1;
        } else if c == '[' {
            i = scan.closing(i);
        } else if c == '{' {
            let (matchers, end) = scan.matchers(i);
            found.push(Selector {
                metric: None,
                matchers,
            });
            i = end;
        } else if c.is_ascii_digit() || c == '.' {
            i = scan.skip(i, |c| c.is_ascii_alphanumeric() || c == '.');
        } else if c == '$' {
            i = scan.skip(i + 1, |c| is_ident(c) || c == '{' || c == '}');
        } else if is_ident_start(c) {
            let end = scan.skip(i, is_ident);
            let word = scan.text(i, end);
            let next = scan.skip(end, char::is_whitespace);
            i = end;
            if LABEL_LISTS.contains(&word.as_str()) {
                if scan.at(next) == Some('(') {
                    i = scan.closing(next);
                }
            } else if !AGGREGATIONS.contains(&word.as_str())
                && !KEYWORDS.contains(&word.as_str())
                && scan.at(next) != Some('(')
            {
                let mut matchers = Vec::new();
                if scan.at(next) == Some('{') {
                    (matchers, i) = scan.matchers(next);
                }
                found.push(Selector {
                    metric: Some(word),
                    matchers,
                });
            }
        } else {
            i += 1;
        }
    }
    found
}

/// The metric names `expr` selects, in order.
pub fn metric_names(expr: &str) -> Vec<String> {
    selectors(expr)
        .into_iter()
        .filter_map(|selector| selector.metric)
        .collect()
}

/// The values `expr`'s selectors match `label` with: `label="value"`. Any other matcher
/// on it (`=~`, `!=`, `!~`) fails: a check built on these values could not follow it.
pub fn matched_values(expr: &str, label: &str) -> BTreeSet<String> {
    selectors(expr)
        .into_iter()
        .flat_map(|selector| selector.matchers)
        .filter(|matcher| matcher.label == label)
        .map(|matcher| {
            assert_eq!(
                matcher.op, "=",
                "{expr}: only {label}=\"…\" matchers are checked"
            );
            matcher.value
        })
        .collect()
}

/// A Prometheus duration: one or more `<number><unit>` with unit ms, s, m, h, d, w, y.
pub fn is_duration(text: &str) -> bool {
    let mut rest = text;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d", "w", "y"]
            .into_iter()
            .find(|unit| rest.starts_with(unit));
        match unit {
            Some(unit) => rest = &rest[unit.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_names_skip_functions_keywords_labels_strings_and_ranges() {
        assert_eq!(
            metric_names(
                "sum(rate(charges_a_total{x=\"charges_not_a_metric\"}[5m])) / max(charges_b) > 0\n\
                 and time() - charges_c > 1 or charges_d[1m] offset 5m # comment charges_e"
            ),
            ["charges_a_total", "charges_b", "charges_c", "charges_d"]
        );
        assert_eq!(
            metric_names(
                "histogram_quantile(0.99, sum by (le, route) (rate(x_bucket{job=~\"$job\"}[$__rate_interval])))\n\
                 + on (job, instance) group_left (binary) build_info * 1e-3\n\
                 + sum without (le) (rate (y[5m])) + up{job=\"a\"} unless absent(z)"
            ),
            ["x_bucket", "build_info", "y", "up", "z"]
        );
    }

    #[test]
    fn matched_values_reads_equality_matchers_only_on_that_label() {
        let found = matched_values(
            r#"absent(up{job="a"} == 1) or x{task="t", job = "b"} or y{cronjob="c"} or {job="d"}"#,
            "job",
        );
        assert_eq!(found, BTreeSet::from(["a", "b", "d"].map(str::to_owned)));
        let selector = &selectors(r#"x{a!~"1|2", b=~'3'}"#)[0];
        let ops: Vec<&str> = selector.matchers.iter().map(|m| m.op.as_str()).collect();
        assert_eq!(ops, ["!~", "=~"]);
    }

    #[test]
    #[should_panic(expected = "only job")]
    fn matched_values_refuses_a_regex_on_that_label() {
        matched_values(r#"up{job=~"a|b"}"#, "job");
    }

    #[test]
    fn durations() {
        assert!(is_duration("5m"));
        assert!(is_duration("1h30m"));
        assert!(is_duration("250ms"));
        assert!(!is_duration("5 minutes"));
        assert!(!is_duration("m5"));
        assert!(!is_duration(""));
    }
}
