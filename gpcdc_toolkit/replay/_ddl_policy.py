"""Which DDL statements from the stream the replayer runs on the target (pure).

A DDL record is text read from a topic, and whoever can write to the topics could put
any SQL there. The replayer runs a record's statement only when PostgreSQL's own
parser (through pglast) reads it as exactly one statement of a kind below, on objects
outside the system schemas and the replayer's own tables, and when the target would
compute the same rows as the source did. Everything else is refused before anything
of its transaction is applied.

Carried exactly:

* ``CREATE TABLE`` (with Greenplum's ``DISTRIBUTED BY``), not temporary, not ``AS``;
* ``ALTER TABLE``: add a column (default absent or a constant, or a stored generated
  column), drop a column, change a column's type (``USING`` absent or an expression of
  the row's own columns), set or drop a default or ``NOT NULL``, add, drop or validate
  a constraint, replica identity;
* renames of tables, columns, constraints, indexes and types;
* ``CREATE INDEX`` / ``DROP INDEX``;
* ``CREATE SCHEMA`` (plain);
* ``CREATE TYPE`` (enum, composite), ``ALTER TYPE ... ADD VALUE``, ``CREATE DOMAIN``,
  ``DROP TYPE`` / ``DROP DOMAIN``.

Refused: anything else (``DROP TABLE``, ``TRUNCATE``, functions, grants, several
statements in one record, ...); and, because the target would compute other values
than the source did for rows that exist, a column added with a non-constant default
(``now()``, ``clock_timestamp()``, ``'now'``, a sequence), an identity or ``serial``
column added to a table, and a ``USING`` expression that calls a function outside a
small set of immutable built-ins. Expressions the target evaluates on every row it is
given (``CHECK`` constraints, index expressions) may call only those built-ins too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import pglast
from pglast import ast
from pglast.enums import AlterTableType, ConstrType, ObjectType

from ..errors import GpcdcError
from ..protocol import DdlError, parse_create_table

SYSTEM_SCHEMAS = frozenset({"pg_catalog", "information_schema", "pg_toast", "gp_dist", "gp_toolkit"})

# Built-ins the target may evaluate for a statement from the stream: immutable, and
# without side effects.
IMMUTABLE_FUNCTIONS = frozenset({
    "abs", "array_length", "btrim", "cardinality", "ceil", "ceiling", "char_length", "character_length",
    "coalesce", "floor", "greatest", "jsonb_typeof", "json_typeof", "least", "left", "length", "lower",
    "ltrim", "md5", "nullif", "octet_length", "position", "replace", "right", "round", "rtrim", "sign",
    "split_part", "strpos", "substr", "substring", "trim", "trunc", "upper",
})

# Words that PostgreSQL reads as the current date or time inside a date/time string.
_CLOCK_WORDS = re.compile(r"\b(now|today|tomorrow|yesterday|allballs)\b", re.IGNORECASE)
# The nodes a constant (a default every existing row takes) may hold.
_CONSTANT_NODES = (ast.A_Const, ast.TypeCast, ast.TypeName, ast.A_ArrayExpr, ast.String, ast.Integer, ast.Float,
                   ast.Boolean, ast.BitString)
# Casts whose result names catalog objects by number, which differ from cluster to cluster.
_CATALOG_TYPES = frozenset({"oid", "regclass", "regtype", "regproc", "regprocedure", "regoper", "regoperator",
                            "regnamespace", "regrole", "regconfig", "regdictionary", "regcollation"})
# Referential actions other than NO ACTION and RESTRICT make the target change rows itself.
_FK_ACTIONS = {"c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}
_SERIAL_TYPES = frozenset({"serial", "serial2", "serial4", "serial8", "smallserial", "bigserial"})

# Nodes an expression may hold: constants, the row's columns, casts, operators, and
# calls of IMMUTABLE_FUNCTIONS (checked apart).
_EXPRESSION_NODES = (ast.A_Const, ast.ColumnRef, ast.TypeCast, ast.TypeName, ast.A_Expr, ast.BoolExpr,
                     ast.NullTest, ast.BooleanTest, ast.CaseExpr, ast.CaseWhen, ast.CoalesceExpr, ast.MinMaxExpr,
                     ast.A_ArrayExpr, ast.String,
                     ast.Integer, ast.Float, ast.Boolean, ast.BitString, ast.FuncCall, ast.CollateClause,
                     ast.A_Indirection, ast.A_Indices, ast.RowExpr)

_ALTER_TABLE = {
    AlterTableType.AT_AddColumn: "ADD COLUMN", AlterTableType.AT_DropColumn: "DROP COLUMN",
    AlterTableType.AT_AlterColumnType: "ALTER COLUMN TYPE", AlterTableType.AT_ColumnDefault: "SET/DROP DEFAULT",
    AlterTableType.AT_SetNotNull: "SET NOT NULL", AlterTableType.AT_DropNotNull: "DROP NOT NULL",
    AlterTableType.AT_AddConstraint: "ADD CONSTRAINT", AlterTableType.AT_DropConstraint: "DROP CONSTRAINT",
    AlterTableType.AT_ValidateConstraint: "VALIDATE CONSTRAINT", AlterTableType.AT_ReplicaIdentity: "REPLICA IDENTITY",
}
_RENAMED = {ObjectType.OBJECT_TABLE, ObjectType.OBJECT_COLUMN, ObjectType.OBJECT_TABCONSTRAINT,
            ObjectType.OBJECT_INDEX, ObjectType.OBJECT_TYPE, ObjectType.OBJECT_DOMAIN, ObjectType.OBJECT_ATTRIBUTE}
_DROPPED = {ObjectType.OBJECT_INDEX, ObjectType.OBJECT_TYPE, ObjectType.OBJECT_DOMAIN}


class DdlRefused(GpcdcError, ValueError):
    """A DDL statement from the stream that the replayer will not run; the message says why."""


@dataclass(frozen=True)
class CheckedDdl:
    statement: str  # as recorded; it runs unchanged
    kind: str  # e.g. "ALTER TABLE ADD COLUMN"
    names: tuple[tuple[str | None, str], ...]  # (schema or None, name) of the objects it names
    # Types of columns it adds without a default of their own: a domain's default would
    # fill existing rows, so whoever runs the statement checks that default too.
    added_types: tuple[str, ...] = ()


def check_ddl(statement: str, *, reserved: frozenset[str] = frozenset()) -> CheckedDdl:
    """The statement, if the replayer may run it on the target; else :class:`DdlRefused`.

    ``reserved`` holds table names no statement may touch (the replayer's own), nor
    anything named after them (their indexes and constraints)."""
    try:
        create = parse_create_table(statement)
    except DdlError as e:
        raise DdlRefused(str(e)) from None
    body = create.statement if create is not None else statement
    try:
        parsed = pglast.parse_sql(body)
    except pglast.parser.ParseError as e:
        raise DdlRefused(f"it does not parse as PostgreSQL ({e})") from None
    if len(parsed) != 1:
        raise DdlRefused(f"it holds {len(parsed)} statements; a DDL record holds one")
    node = parsed[0].stmt
    kind = _kind(node)
    names = tuple(_names(node))
    for schema, name in names:
        if schema is not None and (schema in SYSTEM_SCHEMAS or schema.startswith("pg_")):
            raise DdlRefused(f"{kind} names {schema}.{name}, in a system schema")
        if name.startswith(tuple(reserved)) and reserved:
            raise DdlRefused(f"{kind} names {name}, one of the replayer's own tables or a name beginning as theirs "
                             "(their indexes and constraints)")
    return CheckedDdl(statement, kind, names, tuple(_added_types(node)))


def locked_relations(statement: str) -> tuple[tuple[str | None, str], ...]:
    """(schema or None, name) of the tables a statement locks against their writers: the
    one it alters, truncates, indexes (not concurrently), renames, drops or creates;
    not those it merely names (a view's source, ``LIKE``, ``COMMENT ON``, ``GRANT``).
    () when it does not parse."""
    try:
        create = parse_create_table(statement)
        parsed = pglast.parse_sql(create.statement if create is not None else statement)
    except (DdlError, pglast.parser.ParseError):
        return ()
    out: list[tuple[str | None, str]] = []
    for raw in parsed:
        node = raw.stmt
        if isinstance(node, (ast.AlterTableStmt, ast.CreateStmt)) or (
                isinstance(node, ast.IndexStmt) and not node.concurrent) or (
                isinstance(node, ast.RenameStmt) and node.relation is not None):
            out.append((node.relation.schemaname, node.relation.relname))
        elif isinstance(node, ast.TruncateStmt):
            out += [(r.schemaname, r.relname) for r in node.relations or ()]
        elif isinstance(node, ast.DropStmt) and node.removeType == ObjectType.OBJECT_TABLE:
            out += [(names[-2].sval if len(names) > 1 else None, names[-1].sval) for names in node.objects or ()]
    return tuple(out)


def check_default(expression: str, where: str) -> None:
    """Refuse a stored default (as the catalog prints it) that is not a constant."""
    try:
        (parsed,) = pglast.parse_sql(f"SELECT {expression}")
    except (pglast.parser.ParseError, ValueError):
        raise DdlRefused(f"{where} ({expression!r}) does not parse as one expression") from None
    _check_expression(parsed.stmt.targetList[0].val, where, constant=True)


def _added_types(node: ast.Node) -> Iterator[str]:
    if isinstance(node, ast.AlterTableStmt):
        for cmd in node.cmds:
            column = cmd.def_
            if (cmd.subtype == AlterTableType.AT_AddColumn and column.typeName is not None
                    and not any(c.contype == ConstrType.CONSTR_DEFAULT for c in column.constraints or ())):
                yield ".".join(name.sval for name in column.typeName.names)


def _kind(node: ast.Node) -> str:
    """Name the statement's kind, refusing kinds and forms the replay does not carry."""
    if isinstance(node, ast.CreateStmt):
        if node.relation.relpersistence == "t":
            raise DdlRefused("CREATE TEMPORARY TABLE is session-local and not replayed")
        for element in node.tableElts or ():
            for constraint in _constraints(element):
                _check_row_constraint(constraint, "CREATE TABLE")
        return "CREATE TABLE"
    if isinstance(node, ast.AlterTableStmt):
        if node.objtype != ObjectType.OBJECT_TABLE:
            raise DdlRefused(f"ALTER of a {_object(node.objtype)} is not replayed")
        kinds = [_alter_table_command(cmd) for cmd in node.cmds]
        return "ALTER TABLE " + ", ".join(kinds)
    if isinstance(node, ast.RenameStmt):
        if node.renameType not in _RENAMED:
            raise DdlRefused(f"renaming a {_object(node.renameType)} is not replayed")
        return f"RENAME {_object(node.renameType)}"
    if isinstance(node, ast.IndexStmt):
        for expression in [*(p.expr for p in node.indexParams or () if p.expr is not None), node.whereClause]:
            _check_expression(expression, "an index expression")
        return "CREATE INDEX"
    if isinstance(node, ast.DropStmt):
        if node.removeType not in _DROPPED:
            raise DdlRefused(f"DROP {_object(node.removeType)} is not replayed (apply it by hand if it is genuine)")
        return f"DROP {_object(node.removeType)}"
    if isinstance(node, ast.CreateSchemaStmt):
        if node.schemaElts or node.authrole is not None:
            raise DdlRefused("CREATE SCHEMA with AUTHORIZATION or elements is not replayed")
        return "CREATE SCHEMA"
    if isinstance(node, (ast.CreateEnumStmt, ast.CompositeTypeStmt)):
        return "CREATE TYPE"
    if isinstance(node, ast.AlterEnumStmt):
        return "ALTER TYPE RENAME VALUE" if node.oldVal else "ALTER TYPE ADD VALUE"
    if isinstance(node, ast.CreateDomainStmt):
        for constraint in node.constraints or ():
            _check_row_constraint(constraint, "CREATE DOMAIN")
            if constraint.contype == ConstrType.CONSTR_DEFAULT:  # what a column added of this type takes
                _check_expression(constraint.raw_expr, "the domain's default", constant=True)
        return "CREATE DOMAIN"
    raise DdlRefused(f"a {type(node).__name__} statement is not a kind of DDL the replay carries")


def _object(kind: ObjectType) -> str:
    return ObjectType(kind).name.removeprefix("OBJECT_").replace("TABCONSTRAINT", "CONSTRAINT").replace("_", " ")


def _constraints(element: ast.Node) -> list[ast.Constraint]:
    if isinstance(element, ast.Constraint):
        return [element]
    if isinstance(element, ast.ColumnDef):
        return list(element.constraints or ())
    return []


def _check_row_constraint(constraint: ast.Constraint, where: str) -> None:
    """A constraint the target evaluates on rows: CHECK and generated expressions, and
    foreign keys whose actions would change rows on the target by themselves."""
    if constraint.contype in (ConstrType.CONSTR_CHECK, ConstrType.CONSTR_GENERATED):
        _check_expression(constraint.raw_expr, f"a {where} CHECK or generated expression")
    if constraint.contype == ConstrType.CONSTR_FOREIGN:
        for action in (constraint.fk_upd_action, constraint.fk_del_action):
            if action in _FK_ACTIONS:
                raise DdlRefused(f"a foreign key ON UPDATE/DELETE {_FK_ACTIONS[action]} would make the target change "
                                 "rows itself, which the stream carries already")


def _alter_table_command(cmd: ast.AlterTableCmd) -> str:
    kind = _ALTER_TABLE.get(cmd.subtype)
    if kind is None:
        raise DdlRefused(f"ALTER TABLE {AlterTableType(cmd.subtype).name.removeprefix('AT_')} is not replayed")
    if cmd.subtype == AlterTableType.AT_AddColumn:
        _check_added_column(cmd.def_)
    elif cmd.subtype == AlterTableType.AT_AlterColumnType:
        _check_expression(cmd.def_.raw_default, f"the USING expression of column {cmd.name}")
    elif cmd.subtype == AlterTableType.AT_AddConstraint:
        _check_row_constraint(cmd.def_, "ADD CONSTRAINT")
    return kind


def _check_added_column(column: ast.ColumnDef) -> None:
    """A column added to a table that has rows: the target must fill it as the source did."""
    type_name = column.typeName.names[-1].sval if column.typeName is not None else ""
    if type_name in _SERIAL_TYPES or column.identity not in ("", "\x00", None):
        raise DdlRefused(f"column {column.colname} is added as {type_name or 'an identity'}: existing rows would "
                         "take sequence values in the target's row order, not the source's")
    for constraint in column.constraints or ():
        if constraint.contype == ConstrType.CONSTR_IDENTITY:
            raise DdlRefused(f"column {column.colname} is added as an identity: existing rows would take sequence "
                             "values in the target's row order, not the source's")
        if constraint.contype == ConstrType.CONSTR_DEFAULT:
            _check_expression(constraint.raw_expr, f"the default of added column {column.colname}", constant=True)
        _check_row_constraint(constraint, "ADD COLUMN")


def _check_expression(node: ast.Node | None, where: str, *, constant: bool = False) -> None:
    """Refuse an expression the target could evaluate to other values than the source.
    A ``constant`` holds literals and casts alone."""
    for part in _walk(node):
        if constant and not isinstance(part, _CONSTANT_NODES + (ast.FuncCall,)) and isinstance(part, ast.Node):
            raise DdlRefused(f"{where} holds {_describe(part)}: a default that existing rows take must be a "
                             "literal, so that the target computes what the source did")
        if not isinstance(part, _EXPRESSION_NODES):
            raise DdlRefused(f"{where} holds {_describe(part)}, which the target would evaluate itself: "
                             "only constants, columns, casts, operators and immutable built-ins are run from the stream")
        if isinstance(part, ast.FuncCall):
            schema = part.funcname[0].sval if len(part.funcname) > 1 else None
            name = part.funcname[-1].sval
            if schema not in (None, "pg_catalog") or name not in IMMUTABLE_FUNCTIONS:
                raise DdlRefused(f"{where} calls {name}(), which the target would evaluate itself: "
                                 "only constants, columns, casts, operators and immutable built-ins are run from the stream")
        if constant and isinstance(part, ast.ColumnRef):
            raise DdlRefused(f"{where} refers to a column")
        if isinstance(part, ast.A_Const) and isinstance(part.val, ast.String) and _CLOCK_WORDS.search(part.val.sval):
            raise DdlRefused(f"{where} holds {part.val.sval!r}, which reads as the clock of the server that runs it")
        if isinstance(part, ast.TypeName) and part.names and part.names[-1].sval in _CATALOG_TYPES:
            raise DdlRefused(f"{where} casts to {part.names[-1].sval}, whose values differ from cluster to cluster")


def _describe(node: ast.Node) -> str:
    if isinstance(node, ast.SQLValueFunction):
        return node.op.name.removeprefix("SVFOP_").replace("_", " ")
    return type(node).__name__


def _walk(node: object) -> Iterator[ast.Node]:
    if isinstance(node, (tuple, list)):
        for item in node:
            yield from _walk(item)
    elif isinstance(node, ast.Node):
        yield node
        for field in node:
            yield from _walk(getattr(node, field))


def _names(node: ast.Node) -> Iterator[tuple[str | None, str]]:
    """(schema, name) of every relation and type the statement creates, alters or drops."""
    for part in _walk(node):
        if isinstance(part, ast.RangeVar):
            yield part.schemaname, part.relname
    if isinstance(node, ast.RenameStmt) and node.newname:
        yield None, node.newname
    if isinstance(node, ast.DropStmt):
        for parts in node.objects or ():
            names = [p.sval for p in (parts.names if isinstance(parts, ast.TypeName) else parts)]
            yield (names[-2] if len(names) > 1 else None), names[-1]
    for names in _type_names(node):
        values = [p.sval for p in names]
        yield (values[-2] if len(values) > 1 else None), values[-1]


def _type_names(node: ast.Node) -> Iterator[tuple[ast.String, ...]]:
    if isinstance(node, (ast.CreateEnumStmt, ast.AlterEnumStmt)):
        yield node.typeName
    elif isinstance(node, ast.CreateDomainStmt):
        yield node.domainname
    elif isinstance(node, ast.CreateSchemaStmt):
        yield (ast.String(node.schemaname), ast.String(""))
    elif isinstance(node, ast.RenameStmt) and isinstance(node.object, (tuple, list)):
        yield tuple(node.object)
