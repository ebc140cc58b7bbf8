"""The selector grammar: precedence, literals, keywords, and errors that point at the problem."""

import pytest

from datapath.errors import UserError
from nic_offload.selectors import SelectorSyntaxError, parse
from nic_offload.selectors import nodes as n


def test_and_binds_tighter_than_or_and_not_tighter_than_and():
    tree = parse("a = 1 OR NOT b = 2 AND c = 3")
    assert isinstance(tree, n.Or)
    first, second = tree.items
    assert first == n.Comparison("=", n.Identifier("a"), n.Literal(n.INT, 1))
    assert isinstance(second, n.And) and isinstance(second.items[0], n.Not)


def test_parentheses_override_precedence():
    tree = parse("(a = 1 OR b = 2) AND c = 3")
    assert isinstance(tree, n.And) and isinstance(tree.items[0], n.Or)


def test_keywords_are_case_insensitive_and_identifiers_case_sensitive():
    assert parse("Price between 1 AnD 2") == parse("Price BETWEEN 1 AND 2")
    assert parse("price > 1") != parse("Price > 1")


def test_identifiers_may_start_with_a_keyword_but_not_be_one():
    assert parse("andy = 1 and order_ = 2 or $id IS NULL")
    with pytest.raises(SelectorSyntaxError, match="expected a condition"):
        parse("and = 1")


def test_literals_have_jms_types():
    tree = parse("a = 57 AND b = 7E3 AND c = 7. AND d = 'it''s' AND e = TRUE AND f = .5")
    literals = [item.right for item in tree.items]
    assert [lit.kind for lit in literals] == [n.INT, n.FLOAT, n.FLOAT, n.STR, n.BOOL, n.FLOAT]
    assert [lit.value for lit in literals] == [57, 7000.0, 7.0, "it's", True, 0.5]


def test_literal_arithmetic_folds_so_negative_constants_are_literals():
    assert parse("a > -5") == n.Comparison(">", n.Identifier("a"), n.Literal(n.INT, -5))
    assert parse("a > 2 * 3 - 1").right == n.Literal(n.INT, 5)
    assert parse("a > 7 / 2").right == n.Literal(n.INT, 3)  # exact numerics divide as in Java
    assert parse("a < 1 / 0").right == n.Arith("/", n.Literal(n.INT, 1), n.Literal(n.INT, 0))


def test_the_empty_selector_is_true():
    assert parse("") == n.TRUE and parse("   \n ") == n.TRUE


def test_spacing_does_not_change_the_tree():
    assert parse("a>1 AND b IN('x','y')") == parse(" a  >  1\n and b in ( 'x' , 'y' ) ")


def test_in_lists_drop_duplicates_and_keep_signed_numbers():
    tree = parse("a NOT IN (1, -2, 1, +3.5)")
    assert tree.negated and [lit.value for lit in tree.values] == [1, -2, 3.5]


def test_like_keeps_pattern_and_escape():
    tree = parse(r"name LIKE 'a\_%' ESCAPE '\'")
    assert (tree.pattern, tree.escape, tree.negated) == (r"a\_%", "\\", False)


def test_a_missing_value_after_an_operator_is_reported_at_its_column():
    with pytest.raises(SelectorSyntaxError) as info:
        parse("price > 10 AND volume > ")
    err = info.value
    assert str(err).startswith("selectors: syntax error at column 24: expected a value after '>'")
    assert isinstance(err, UserError) and err.component == "selectors"
    assert (err.line, err.column) == (1, 24)  # just after the last token
    assert str(err).endswith("    price > 10 AND volume > \n" + " " * 27 + "^")


def test_an_unexpected_keyword_is_named_with_what_was_expected():
    with pytest.raises(SelectorSyntaxError, match=r"column 9: unexpected 'AND': expected a "
                                                  r"value after '>'"):
        parse("price > AND x = 1")


@pytest.mark.parametrize("text, column, message", [
    ("a b", 3, "unexpected 'b' after 'a': expected an operator"),
    ("(a > 1", 7, "ends too early after '1'"),
    ("s = 'abc", 5, "unterminated string"),
    ("a != 1", 3, "use <>"),
    ('a = "x"', 5, "quoted with '"),
    ("a # 1", 3, "unexpected character '#'"),
    ("a > TRUE", 5, "booleans compare only with = and <>"),
    ("x BETWEEN FALSE AND 2", 11, "booleans have no order"),
    ("x IN (1, 'a')", 10, "strings or numbers, not both"),
    ("x IN ()", 7, "expected a value after '('"),
    ("5", 1, "expected a condition"),
    ("a + 1", 1, "found an arithmetic expression"),
    ("NOT 'x'", 5, "found a string"),
    ("(a > 1) + 2", 2, "needs a value, found a condition"),
    ("'a' * 2 > 1", 1, "'*' needs numbers"),
    ("s LIKE 'a' ESCAPE 'xy'", 19, "ESCAPE takes one character"),
    ("s LIKE 'a!' ESCAPE '!'", 8, "ends with its escape character"),
    ("a IS 5", 6, "expected NOT or NULL"),
])
def test_syntax_errors_name_the_column_and_the_fix(text, column, message):
    with pytest.raises(SelectorSyntaxError) as info:
        parse(text)
    assert info.value.column == column
    assert message in str(info.value)


def test_errors_on_later_lines_give_line_and_column():
    with pytest.raises(SelectorSyntaxError) as info:
        parse("a = 1\n  AND > 3")
    assert (info.value.line, info.value.column) == (2, 7)
    assert "line 2, column 7" in str(info.value)
    assert str(info.value).endswith("      AND > 3\n" + " " * 10 + "^")


def test_a_selector_must_be_text():
    with pytest.raises(SelectorSyntaxError, match="a selector is text"):
        parse(42)
