//! What an orderable column is: its name, how its values compare, which requests may name it in
//! an `order_by`. Each entity's list is the entity table's `order` column (`orderable.rs`);
//! [`crate::sort`] checks an `order_by` against it and compares values by their kind.

/// How a column's values compare, from the SQL type PuppetDB selects for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnKind {
    /// A text column: strings byte-wise.
    Text,
    /// An integer column (`line`, `report_format`, event counts): numerically.
    Number,
    /// A boolean column: false before true.
    Boolean,
    /// A `timestamptz` column: the ISO 8601 string is parsed and compared as an instant.
    Timestamp,
    /// A `text[]` column (`containment_path`, `tags`): element-wise, then shorter first.
    TextArray,
    /// A `jsonb` column (facts `value`, `parameters`, `facts`, `trusted`): jsonb order; a JSON
    /// `null` is a jsonb value here, not SQL NULL.
    Jsonb,
    /// A text column holding serialized JSON (events `new_value`/`old_value`): the compact JSON
    /// text byte-wise, as PostgreSQL sorts the stored text (`null` is the text `null`).
    JsonText,
    /// A fact path as `/fact-contents` stores it (`text[]`): element-wise, each element (a
    /// string or an array index) compared as text, then shorter first.
    PathArray,
    /// A fact path as `/fact-paths` stores it: the elements joined by `#~` and compared as text.
    EncodedPath,
    /// Not a known column (a function alias such as `count`, a query-only field): keyed by the
    /// value's JSON type.
    Other,
}

/// `summarize_by` of `/event-counts`, which decides the columns it can be ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SummarizeBy {
    /// `certname`.
    Certname,
    /// `resource` (rows carry `resource_type` and `resource_title`).
    Resource,
    /// `containing_class`.
    ContainingClass,
}

impl SummarizeBy {
    /// The parameter's spelling (and the `subject_type` of its rows).
    pub fn as_str(self) -> &'static str {
        match self {
            SummarizeBy::Certname => "certname",
            SummarizeBy::Resource => "resource",
            SummarizeBy::ContainingClass => "containing_class",
        }
    }

    /// Reads the `summarize_by` parameter; `None` for anything PuppetDB rejects.
    pub fn from_param(raw: &str) -> Option<SummarizeBy> {
        match raw {
            "certname" => Some(SummarizeBy::Certname),
            "resource" => Some(SummarizeBy::Resource),
            "containing_class" => Some(SummarizeBy::ContainingClass),
            _ => None,
        }
    }
}

/// Which requests may order by a column: every request on its entity, or only those whose
/// parameters add the column's set. A request adds at most one set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ColumnSet {
    /// Every request (as a request's set: its parameters add no column).
    Base,
    /// `/nodes` with `include_facts_expiration=true`: `expires_facts`, `expires_facts_updated`.
    FactsExpiration,
    /// `/event-counts` with this `summarize_by`: the subject's columns.
    SummarizedBy(SummarizeBy),
}

impl ColumnSet {
    /// The set a record or extract request adds: `/nodes`' expiration columns when
    /// `include_facts_expiration` (`raw`, the parameter if given) is `true` in any case, as
    /// PuppetDB reads it; else none.
    pub fn facts_expiration(raw: Option<&str>) -> ColumnSet {
        match raw.is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            true => ColumnSet::FactsExpiration,
            false => ColumnSet::Base,
        }
    }
}

/// One column an entity can be ordered by. Use it to write an entity's column list, in the order
/// PuppetDB 7.12.1 names the columns in its "Supported columns are ..." error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Column {
    /// The name, as `order_by` and the records spell it.
    pub name: &'static str,
    /// How its values compare.
    pub kind: ColumnKind,
    /// Which requests may order by it.
    pub set: ColumnSet,
}

impl Column {
    /// A column every request on its entity may order by.
    pub const fn new(name: &'static str, kind: ColumnKind) -> Column {
        Column {
            name,
            kind,
            set: ColumnSet::Base,
        }
    }

    /// This column, offered only to the requests that add `set`.
    pub const fn only_in(self, set: ColumnSet) -> Column {
        Column { set, ..self }
    }
}

/// An entity's columns as one request may order by them: the entity's list and the set the
/// request's parameters add. Get it from [`super::Entity::order_columns`];
/// [`crate::sort::parse_paging`] checks an `order_by` against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OrderColumns {
    /// Every column of the entity, whichever set offers it.
    columns: &'static [Column],
    /// The set the request adds.
    added: ColumnSet,
}

impl OrderColumns {
    /// The columns of `columns` offered to a request that adds `added`; an entity's come from
    /// [`super::Entity::order_columns`].
    pub(super) fn new(columns: &'static [Column], added: ColumnSet) -> OrderColumns {
        OrderColumns { columns, added }
    }

    /// The columns the request may order by, in the list's order.
    fn offered(self) -> impl Iterator<Item = &'static Column> {
        self.columns
            .iter()
            .filter(move |c| c.set == ColumnSet::Base || c.set == self.added)
    }

    /// The names the request may order by, in the order PuppetDB lists them in its "Supported
    /// columns" error. Use it to validate or to document; [`crate::sort::parse_paging`] already
    /// checks.
    pub fn supported(self) -> impl Iterator<Item = &'static str> {
        self.offered().map(|c| c.name)
    }

    /// The offered column named `name`, if the request may order by it. Use it to check an
    /// `order_by` field.
    pub(crate) fn find(self, name: &str) -> Option<&'static Column> {
        self.offered().find(|c| c.name == name)
    }

    /// How `field` compares, whichever of the entity's sets offers it (so an `/event-counts`
    /// subject column reads as its type even where `summarize_by` does not offer it). Use it to
    /// build an [`crate::sort::OrderField`] for an order that did not come through
    /// [`crate::sort::parse_paging`], such as an in-query `["order_by", ...]`; a name that is not a
    /// column (a function alias) gets [`ColumnKind::Other`].
    pub fn kind(self, field: &str) -> ColumnKind {
        self.columns
            .iter()
            .find(|c| c.name == field)
            .map_or(ColumnKind::Other, |c| c.kind)
    }
}
