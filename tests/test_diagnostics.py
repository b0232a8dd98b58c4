"""Every user-facing error message of irc, provoked, located and formatted.

The table below holds one input per message (or per way of reaching it): the
source, where the error must point (LINE:COL) and a piece of the message. Each
case runs through `irc-opt` in-process and must print
`FILE:LINE:COL: error: MESSAGE`, the source line and a caret under the column,
exit with status 1, and print nothing else that looks like a traceback or a
lark token name. `test_every_message_is_provoked` reads the message templates
out of the compiler's source and checks that each one is produced by some case,
so a new message without a test fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    FloatAttr,
    FunctionType,
    ModuleOp,
    TensorType,
    f32,
    f64,
)
from xdsl.ir import Block, Region
from xdsl.passes import ModulePass

import irc.tools.opt
from irc.analysis.verifier import verify
from irc.dialects import graph
from irc.ir.types import F32
from irc.passes import PASSES
from irc.pipeline import build_pipeline, run_pipeline
from irc.syntax.diagnostics import Diagnostic, IrcError, Location, SourceManager
from irc.syntax.parser import decode_source, parse, read_source

ROOT = Path(__file__).resolve().parents[1]
LARK_NAMES = re.compile(
    r"\b(RSQB|LSQB|RPAR|LPAR|RBRACE|LBRACE|MORETHAN|LESSTHAN|COMMA|COLON|EQUAL|ARROW|_NL|"
    r"VALUE|SYMBOL|OPNAME|TYPE_NAME|SHAPE|NUMBER|STRING|\$END|__ANON_\d+)\b"
)

H = (
    "func @f(%x: tensor<4x8xf32>, %b: tensor<8xf32>, %m: tensor<4x8xi1>, %s: tensor<f32>, "
    "%i: tensor<4x8xi32>) -> tensor<4x8xf32> {\n"
)
R = "  return %x : tensor<4x8xf32>\n}\n"


def fn(*body: str) -> str:
    """A function with arguments %x %b %m %s %i whose body lines start at line 2."""
    return H + "".join(line + "\n" for line in body) + R


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    source: str
    where: str  # "LINE:COL"
    message: str  # a piece of the message


C = Case
CASES = [
    # --- reading the file -------------------------------------------------------
    C("not-utf8", "func @f() {\n  \xff\n}\n", "2:3", "the file is not UTF-8 text (byte 0xff at"),
    # --- syntax: types -----------------------------------------------------------
    C("type-unclosed", fn("  %y = graph.exp %x : tensor<4x8xf32)"), "2:37",
      "expected '>' to close the tensor type, found ')'"),
    C("type-unclosed-memref", fn("  %y = graph.exp %x : memref<4x8xf32 }"), "2:38",
      "expected '>' to close the memref type, found '}'"),
    C("type-empty-shape", fn("  %y = graph.exp %x : tensor<>"), "2:30",
      "expected a shape like 4x8xf32 or f32 after 'tensor<', found '>'"),
    C("type-spaces", fn("  %y = graph.exp %x : tensor<4 x f32>"), "2:32",
      "unexpected 'x' in the tensor type: write it without spaces, like tensor<4x8xf32>"),
    C("type-name-junk", fn("  %y = graph.exp %x : tensor 4x8xf32"), "2:30",
      "unexpected '4' after the type name 'tensor': a type is written like tensor<4x8xf32>"),
    C("type-name-unknown", fn("  %y = graph.exp %x : tenser 4x8xf32"), "2:23",
      "unknown type 'tenser': a type is written like tensor<4x8xf32> (or f32 for a scalar)"),
    # --- syntax: attribute dictionaries and lists ----------------------------------
    C("list-separator", fn("  %y = graph.reduce_sum %x {dims = [1 0]}"), "2:39",
      "expected ',' or ']' in the list, found '0'"),
    C("list-element", fn("  %y = graph.reduce_sum %x {dims = [,]}"), "2:37",
      "expected a list element (a number, true, false or a type), found ','"),
    C("attr-name", fn("  %y = graph.reduce_sum %x {= [1]}"), "2:29",
      "expected an attribute name like dims, found '='"),
    C("attr-equals", fn("  %y = graph.reduce_sum %x {dims: [1]}"), "2:33",
      "expected '=' after the attribute name, found ':'"),
    C("attr-value", fn("  %y = graph.reduce_sum %x {dims = }"), "2:36",
      "expected an attribute value (a number, true, false, a list like [0, 1] or a type), "
      "found '}'"),
    C("attr-separator", fn("  %y = graph.reduce_sum %x {dims = [1] keepdim = true}"), "2:40",
      "expected ',' or '}' in the attribute dictionary, found 'keepdim'"),
    # --- syntax: function headers ---------------------------------------------------
    C("func-name", "func f(%x: tensor<4xf32>) {\n}\n", "1:6",
      "expected a function name like @f after 'func', found 'f'"),
    C("func-symbol", "func @(%x: tensor<4xf32>) {\n}\n", "1:6",
      "expected a function name after '@' (letters, digits, _ . $ -)"),
    C("func-paren", "func @f {\n}\n", "1:9",
      "expected '(' and the arguments after the function name, found '{'"),
    C("func-arrow", "func @f(%x: tensor<4xf32>) tensor<4xf32> {\n}\n", "1:28",
      "expected '->' and the result types, or '{', found 'tensor'"),
    C("func-brace", "func @f(%x: tensor<4xf32>) -> tensor<4xf32> %x {\n}\n", "1:45",
      "expected '{' to open the function body, found '%x'"),
    C("func-results", "func @f(%x: tensor<4xf32>) -> {\n}\n", "1:31",
      "expected the result type(s) after '->', found '{'"),
    C("func-result-list", "func @f() -> (tensor<4xf32> tensor<4xf32>) {\n}\n", "1:29",
      "expected ',' or ')' in the list of result types, found 'tensor'"),
    C("func-result-type", "func @f() -> (, tensor<4xf32>) {\n}\n", "1:15",
      "expected a result type like tensor<4xf32>, found ','"),
    C("arg-colon", "func @f(%x, %y: tensor<4xf32>) {\n}\n", "1:11",
      "expected ':' and a type after the argument name, found ','"),
    C("arg-type", "func @f(%x: ) {\n}\n", "1:13",
      "expected the argument's type, like tensor<4xf32>, found ')'"),
    C("arg-separator", "func @f(%x: tensor<4xf32> %y: tensor<4xf32>) {\n}\n", "1:27",
      "expected ',' or ')' in the argument list, found '%y'"),
    C("arg-name", "func @f(x: tensor<4xf32>) {\n}\n", "1:9",
      "expected an argument like %x: tensor<4xf32>, found 'x'"),
    C("body-same-line", "func @f(%x: tensor<4xf32>) -> tensor<4xf32> { return %x : tensor<4xf32>\n}\n",
      "1:47", "expected the end of the line after '{', found 'return' (the body starts on the next"),
    # --- syntax: statements ------------------------------------------------------------
    C("one-op-a-line", fn("  %y = graph.exp %x : tensor<4x8xf32> %y"), "2:39",
      "unexpected '%y' after the op; expected the end of the line (one op a line)"),
    C("after-return", H + "  return %x : tensor<4x8xf32> %x\n}\n", "2:31",
      "unexpected '%x' after the return; expected the end of the line"),
    C("statement-start", fn("  ? = graph.exp %x"), "2:3",
      "expected an op like '%y = graph.add %a, %b', 'return' or '}', found '?'"),
    C("statement-char", fn("  # = graph.exp %x"), "2:3",
      "expected an op like '%y = graph.add %a, %b', 'return' or '}', found character '#'"),
    C("statement-word", fn("  exp %x"), "2:3",
      "expected an op name like graph.exp (ops are written DIALECT.OP), found 'exp'"),
    C("op-name-after-equals", fn("  %y = exp %x"), "2:8",
      "expected an op name like graph.exp (ops are written DIALECT.OP), found 'exp'"),
    C("op-after-equals", fn("  %y = %x"), "2:8",
      "expected an op name like graph.add after '=', found '%x'"),
    C("type-after-colon", fn("  %y = graph.exp %x :"), "2:22",
      "expected a type like tensor<4xf32> after ':', found the end of the line"),
    C("value-after-comma", fn("  %y = graph.add %x, : tensor<4x8xf32>"), "2:22",
      "expected a value name like %x after ',', found ':'"),
    C("type-after-comma", H + "  return %x, %x : tensor<4x8xf32>, \n}\n", "2:35",
      "expected a type like tensor<4xf32> after ',', found the end of the line"),
    C("equals-after-results", fn("  %y graph.exp %x"), "2:6",
      "expected '=' after the result names, found 'graph.exp'"),
    C("value-name", fn("  %y = graph.exp % : tensor<4x8xf32>"), "2:18",
      "expected a value name after '%' (letters, digits, _ . $ -)"),
    C("region-args", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>, ) {"), "2:45",
      "expected an argument like %x: tensor<4xf32>, found ')'"),
    # --- syntax: the file's structure --------------------------------------------------
    C("unmatched-brace", "}\n", "1:1", "unmatched '}': no function or module is open here"),
    C("return-outside", "  return %y : tensor<4xf32>\n", "1:3",
      "found 'return' outside any function; expected 'func' or 'module' (is the 'func' line "
      "missing?)"),
    C("closed-early", H + "  %y = graph.exp %x\n}\n  return %y : tensor<4x8xf32>\n}\n", "4:3",
      "found 'return' outside any function; expected 'func' or 'module' (does a '}' above close "
      "the function too early?)"),
    C("toplevel-word", "function @f() {\n}\n", "1:1", "expected 'func' or 'module', found 'function'"),
    C("op-outside", "%y = graph.exp %x\n", "1:6",
      "'graph.exp' outside any function: ops are written inside 'func @name(...) { ... }'"),
    C("module-brace", "module module\n", "1:8", "expected '{' after 'module', found 'module'"),
    C("module-content", "module {\n  return %x : tensor<4xf32>\n}\n", "2:3",
      "expected 'func' or '}' in the module, found 'return' outside any function"),
    C("module-op", "module {\n  %y = graph.exp %x\n}\n", "2:8",
      "'graph.exp' outside any function: ops are written inside 'func @name(...) { ... }'"),
    C("op-after-function", H + R + "%y = graph.exp %x\n", "4:6",
      "'graph.exp' outside any function: ops are written inside 'func @name(...) { ... }' "
      "(does a '}' above close the function too early?)"),
    C("module-junk", "module {\n  fun @f() {\n}\n", "2:3",
      "expected 'func' or '}' in the module, found 'fun'"),
    C("module-unclosed", "module {\n", "1:1",
      "module is not closed: expected '}' before the end of the file"),
    C("region-unclosed", "%y = graph.fused %x (%a: tensor<4xf32>) {\n  graph.yield %a\n", "1:41",
      "'{' is not closed: expected '}' before the end of the file"),
    C("func-unclosed", "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  return %x : tensor<4xf32>\n",
      "1:1", "function @f is not closed: expected '}' before the end of the file"),
    C("func-unclosed-in-module", "module {\n  func @g() {\n    return\n  }\n  func @f() {\n",
      "5:3", "function @f is not closed: expected '}' before the end of the file"),
    # --- names and SSA -------------------------------------------------------------------
    C("redefinition", fn("  %y = graph.exp %x", "  %y = graph.neg %x"), "3:3", "%y is already defined"),
    C("arg-redefinition", "func @f(%x: tensor<4xf32>, %x: tensor<4xf32>) {\n  return\n}\n", "1:28",
      "%x is already defined"),
    C("use-before-def", fn("  %y = graph.exp %z", "  %z = graph.exp %x"), "2:18",
      "%z is used before it is defined"),
    C("undefined", fn("  %y = graph.exp %xx"), "2:18", "use of undefined value %xx (did you mean %x?)"),
    C("undefined-no-hint", fn("  %y = graph.exp %qqq"), "2:18", "use of undefined value %qqq"),
    C("function-twice", H + R + H + R, "4:6", "function @f is defined twice"),
    C("after-return-op", H + "  return %x : tensor<4x8xf32>\n  %y = graph.exp %x\n}\n", "3:3",
      "nothing may follow 'return' in a function"),
    C("return-in-region",
      fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {", "    return %a : tensor<4x8xf32>",
         "  } : tensor<4x8xf32>"), "3:5", "'return' ends a function; this region is not one"),
    C("no-return", H + "  %y = graph.exp %x\n  }\n", "3:3", "function @f must end with 'return'"),
    C("no-return-empty", "func @f() {\n}\n", "2:1", "function @f must end with 'return'"),
    C("return-count", H + "  return %x, %x : tensor<4x8xf32>\n}\n", "2:3",
      "return lists 2 values but 1 types"),
    C("return-written-type", H + "  return %x : tensor<4x8xf16>\n}\n", "2:10",
      "return: %x has type tensor<4x8xf32>, written as tensor<4x8xf16>"),
    # The op's written type is wrong and the return repeats the declared one: the op is at fault.
    C("return-after-wrong-op-type", H + "  %z = graph.exp %x : tensor<4x9xf32>\n"
      "  return %z : tensor<4x8xf32>\n}\n", "2:3",
      "graph.exp: result type tensor<4x9xf32> does not match the inferred type tensor<4x8xf32>"),
    # --- ops ------------------------------------------------------------------------------
    C("unknown-op", fn("  %y = graph.expp %x"), "2:8", "unknown op 'graph.expp' (did you mean graph.exp?)"),
    C("unknown-op-no-hint", fn("  %y = qqq.zzz %x"), "2:8", "unknown op 'qqq.zzz'"),
    C("func-op", fn("  %y = func.call %x"), "2:8", "'func.call' is not an op of irc's text format"),
    C("too-many-operands", fn("  %y = graph.exp %x, %x"), "2:22", "graph.exp takes 1 operand, got 2"),
    C("no-operands", fn("  %y = graph.add"), "2:8", "graph.add takes 2 operands, got none"),
    C("no-region", fn("  %y = graph.exp %x (%a: tensor<f32>) {", "    %z = graph.exp %a",
                      "  } : tensor<4x8xf32>"), "2:21", "graph.exp takes no region"),
    C("needs-region", fn("  %y = graph.fused %x : tensor<4x8xf32>"), "2:8",
      "graph.fused needs a region: '(%arg: type) { ... }'"),
    C("no-value", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {", "    %z = graph.yield %a",
                     "  } : tensor<4x8xf32>"), "3:5", "graph.yield produces no value"),
    C("no-value-types", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {",
                           "    graph.yield %a : tensor<4x8xf32>", "  } : tensor<4x8xf32>"), "3:5",
      "graph.yield produces no value: nothing may follow ':'"),
    C("needs-name", fn("  graph.exp %x"), "2:3", "graph.exp produces a value: write '%name = graph.exp ...'"),
    C("too-many-names", fn("  %y, %z = graph.exp %x"), "2:3",
      "graph.exp produces 1 value, but 2 names are written before '='"),
    C("types-count", fn("  %y = graph.exp %x : tensor<4x8xf32>, tensor<4x8xf32>"), "2:3",
      "graph.exp: 1 result but 2 types after ':'"),
    C("needs-type", fn("  %y = graph.reshape %x"), "2:8",
      "graph.reshape needs its result type written after ':'"),
    C("needs-types", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {", "    graph.yield %a", "  }"),
      "2:8", "graph.fused needs its result types written after ':'"),
    C("non-tensor-result", fn("  %y = graph.exp %x : f32"), "2:23",
      "graph.exp produces a tensor: write its type like tensor<4x8xf32>, not f32"),
    # --- attributes -------------------------------------------------------------------------
    C("unknown-attr", fn("  %y = graph.exp %x {dims = [1]}"), "2:22",
      "graph.exp has no attribute 'dims' (its attributes: none)"),
    C("unknown-attr-listed", fn("  %y = graph.reduce_sum %x {dim = 1}"), "2:29",
      "graph.reduce_sum has no attribute 'dim' (its attributes: dims, keepdim)"),
    C("attr-twice", fn("  %y = graph.reduce_sum %x {dims = [1], dims = [0]}"), "2:41",
      "attribute 'dims' is given twice"),
    C("int-too-big", fn("  %y = graph.reduce_sum %x {dims = [99999999999999999999]}"), "2:37",
      "integer '99999999999999999999' does not fit in 64 bits"),
    C("int-huge", fn("  %y = graph.reduce_sum %x {dims = [" + "9" * 5000 + "]}"), "2:37",
      "integer '999999999999999999999999999...' does not fit in 64 bits"),
    C("float-too-big", fn("  %c = graph.constant {value = 1.0e999} : tensor<f32>"), "2:32",
      "number '1.0e999' is too large for f64"),
    C("list-depth", fn("  %y = graph.reduce_sum %x {dims = " + "[" * 40 + "]" * 40 + "}"), "2:52",
      "lists nest more than 16 deep"),
    # --- types ------------------------------------------------------------------------------
    C("type-needs-shape", fn("  %y = graph.exp %x : tensor"), "2:23",
      "tensor type needs a shape: tensor<4x8xf32>, or tensor<f32> for rank 0"),
    C("type-unknown", fn("  %y = graph.exp %x : floaty"), "2:23",
      "unknown type 'floaty' (expected tensor<...> or one of f32, f16, bf16, f64, i64, i32, i1"),
    C("type-unknown-shaped", fn("  %y = graph.exp %x : vector<4x8xf32>"), "2:23",
      "unknown type 'vector<4x8xf32>' (expected tensor<...>)"),
    C("element-type", fn("  %y = graph.exp %x : tensor<4x8xf33>"), "2:34",
      "unknown element type 'f33' (expected one of f32 f16 bf16 f64 i64 i32 i1)"),
    C("element-index", fn("  %y = graph.exp %x : tensor<4x8xindex>"), "2:34",
      "unknown element type 'index'"),
    C("malformed-dim", fn("  %y = graph.exp %x : tensor<4x-8xf32>"), "2:32",
      "malformed dimension in 'tensor<4x-8xf32>': dimensions are positive integers separated by"),
    C("zero-dim", fn("  %y = graph.exp %x : tensor<0x8xf32>"), "2:30",
      "dimension 0 in 'tensor<0x8xf32>' must be positive"),
    C("huge-dim", fn("  %y = graph.exp %x : tensor<" + "9" * 30 + "xf32>"), "2:30",
      "dimension '999999999999999999999999999999' in 'tensor<...>' is too large"),
    C("too-many-elements", fn("  %y = graph.exp %x : tensor<65536x65536x65536x2xf32>"), "2:30",
      "'tensor<65536x65536x65536x2xf32>' has 5.63e+14 elements, more than irc supports (2**48)"),
    # --- graph ops: operands ---------------------------------------------------------------
    C("not-a-tensor", "func @f(%x: f32) -> f32 {\n  %y = graph.exp %x\n  return %y : f32\n}\n",
      "2:3", "graph.exp: operand 0 must be a tensor, got f32"),
    C("needs-float", fn("  %y = graph.exp %i"), "2:3",
      "graph.exp needs a floating-point operand, got tensor<4x8xi32> (use graph.cast to convert)"),
    C("not-on-i1", fn("  %y = graph.neg %m"), "2:3",
      "graph.neg is not defined on i1 tensors, got tensor<4x8xi1> (use graph.cast to convert)"),
    C("element-mismatch", fn("  %y = graph.add %x, %i"), "2:3",
      "graph.add: operands must share one element type, got tensor<4x8xf32> and tensor<4x8xi32>"),
    C("no-broadcast", fn("  %c = graph.constant {value = 1.0} : tensor<5xf32>", "  %y = graph.add %x, %c"),
      "3:3", "graph.add: operand shapes do not broadcast: tensor<4x8xf32>, tensor<5xf32>"),
    C("float-binary", fn("  %y = graph.div %i, %i"), "2:3", "graph.div needs a floating-point operand"),
    C("where-condition", fn("  %y = graph.where %x, %x, %x"), "2:3",
      "graph.where: the condition must be an i1 tensor, got tensor<4x8xf32>"),
    C("where-elements", fn("  %y = graph.where %m, %x, %i"), "2:3",
      "graph.where: operands must share one element type, got tensor<4x8xf32> and tensor<4x8xi32>"),
    C("written-type", fn("  %y = graph.reduce_sum %x {dims = [1]} : tensor<4x1xf32>"), "2:3",
      "graph.reduce_sum: result type tensor<4x1xf32> does not match the inferred type tensor<4xf32>"),
    # --- graph ops: attributes --------------------------------------------------------------
    C("needs-list", fn("  %y = graph.reduce_sum %x"), "2:3",
      "graph.reduce_sum needs the attribute 'dims', like {dims = [0]}"),
    C("list-of-ints", fn("  %y = graph.reduce_sum %x {dims = [true]}"), "2:3",
      "graph.reduce_sum: 'dims' must be a list of integers like [0, 1]"),
    C("bool", fn("  %y = graph.reduce_sum %x {dims = [1], keepdim = 1}"), "2:3",
      "graph.reduce_sum: 'keepdim' must be true or false"),
    C("needs-int", fn("  %y = graph.softmax %x"), "2:3",
      "graph.softmax needs the attribute 'dim', like {dim = 0}"),
    C("int", fn("  %y = graph.softmax %x {dim = 1.0}"), "2:3", "graph.softmax: 'dim' must be an integer"),
    C("needs-number", fn("  %y = graph.constant : tensor<f32>"), "2:3",
      "graph.constant needs the attribute 'value', like {value = 1.0}"),
    C("layer-norm-default-eps", fn("  %y = graph.layer_norm %x, %b, %b {dims = [1]}", "  %z = graph.exp"),
      "3:8", "graph.exp takes 1 operand, got none"),
    C("number", fn("  %y = graph.layer_norm %x, %b, %b {dims = [1], eps = [1]}"), "2:3",
      "graph.layer_norm: 'eps' must be a number"),
    C("dim-range", fn("  %y = graph.reduce_sum %x {dims = [2]}"), "2:3",
      "graph.reduce_sum: dims entry 2 is out of range for a rank-2 operand (valid: -2..1)"),
    C("dim-range-rank0", fn("  %y = graph.reduce_sum %s {dims = [0]}"), "2:3",
      "graph.reduce_sum: dims entry 0 is out of range for a rank-0 operand"),
    C("dim-twice", fn("  %y = graph.reduce_sum %x {dims = [1, -1]}"), "2:3",
      "graph.reduce_sum: dimension 1 appears twice in 'dims'"),
    C("dims-empty", fn("  %y = graph.reduce_sum %x {dims = []}"), "2:3",
      "graph.reduce_sum: 'dims' must name at least one dimension"),
    C("reduce-sum-i1", fn("  %y = graph.reduce_sum %m {dims = [1]}"), "2:3",
      "graph.reduce_sum is not defined on i1 tensors"),
    C("reduce-mean-int", fn("  %y = graph.reduce_mean %i {dims = [1]}"), "2:3",
      "graph.reduce_mean needs a floating-point operand"),
    # --- graph ops: type and layout changes --------------------------------------------------
    C("cast-shape", fn("  %y = graph.cast %x : tensor<8x4xf16>"), "2:3",
      "graph.cast changes only the element type: tensor<4x8xf32> cannot become tensor<8x4xf16>"),
    C("constant-bool", fn("  %y = graph.constant {value = true} : tensor<f32>"), "2:3",
      "graph.constant: a true/false value needs an i1 tensor, got tensor<f32>"),
    C("constant-i1", fn("  %y = graph.constant {value = 2} : tensor<4xi1>"), "2:3",
      "graph.constant: an i1 value must be true, false, 0 or 1"),
    C("constant-int", fn("  %y = graph.constant {value = 2.5} : tensor<4xi32>"), "2:3",
      "graph.constant: 2.5 is not an integer, as tensor<4xi32> needs"),
    C("constant-i32", fn("  %y = graph.constant {value = 3000000000} : tensor<4xi32>"), "2:3",
      "graph.constant: 3000000000 does not fit in i32"),
    C("constant-i32-float-notation", fn("  %y = graph.constant {value = 2.147483648e9} : tensor<4xi32>"),
      "2:3", "graph.constant: 2147483648.0 does not fit in i32"),
    C("constant-i64-float-notation", fn("  %y = graph.constant {value = 1e19} : tensor<4xi64>"),
      "2:3", "graph.constant: 1e+19 does not fit in i64"),
    C("constant-string", fn('  %y = graph.constant {value = "x"} : tensor<4xf32>'), "2:3",
      "graph.constant: 'value' must be a number"),
    C("reshape-element", fn("  %y = graph.reshape %x : tensor<32xf16>"), "2:3",
      "graph.reshape keeps the element type: tensor<4x8xf32> cannot become tensor<32xf16>"),
    C("reshape-count", fn("  %y = graph.reshape %x : tensor<31xf32>"), "2:3",
      "graph.reshape must keep the element count: tensor<4x8xf32> has 32, tensor<31xf32> has 31"),
    C("broadcast-element", fn("  %y = graph.broadcast %x : tensor<4x8xf16>"), "2:3",
      "graph.broadcast keeps the element type: tensor<4x8xf32> cannot become tensor<4x8xf16>"),
    C("broadcast-shape", fn("  %y = graph.broadcast %x : tensor<4x9xf32>"), "2:3",
      "graph.broadcast: tensor<4x8xf32> does not broadcast to tensor<4x9xf32>"),
    C("transpose-needs-perm", fn("  %y = graph.transpose %x"), "2:3",
      "graph.transpose needs the attribute 'perm', like {perm = [0]}"),
    C("transpose-length", fn("  %y = graph.transpose %x {perm = [0]}"), "2:3",
      "graph.transpose: perm has 1 entry for a rank-2 operand"),
    C("transpose-range", fn("  %y = graph.transpose %x {perm = [0, 2]}"), "2:3",
      "graph.transpose: perm entry 2 is out of range for a rank-2 operand (valid: -2..1)"),
    # --- graph ops: indexing and generation ---------------------------------------------
    C("slice-needs-end", fn("  %y = graph.slice %x {start = [0, 0]}"), "2:3",
      "graph.slice needs the attribute 'end', like {end = [0]}"),
    C("slice-length", fn("  %y = graph.slice %x {start = [0], end = [4, 8]}"), "2:3",
      "graph.slice: 'start' has 1 entry for a rank-2 operand (one per dimension)"),
    C("slice-step", fn("  %y = graph.slice %x {start = [0, 0], end = [4, 8], step = [1, 0]}"),
      "2:3", "graph.slice: step 0 of dimension 1 must be 1 or more"),
    C("slice-range", fn("  %y = graph.slice %x {start = [0, 2], end = [4, 9]}"), "2:3",
      "graph.slice: dimension 1 of size 8 cannot be sliced 2:9 (needs 0 <= start <= end <= 8)"),
    C("slice-empty", fn("  %y = graph.slice %x {start = [1, 0], end = [1, 8]}"), "2:3",
      "graph.slice: dimension 0 is sliced empty (1:1)"),
    C("concat-none", fn("  %y = graph.concat {dim = 0} : tensor<4xf32>"), "2:3",
      "graph.concat needs at least one operand"),
    C("concat-rank-0", fn("  %y = graph.concat %s, %s {dim = 0}"), "2:3",
      "graph.concat needs operands of rank 1 or more"),
    C("concat-shapes", fn("  %y = graph.concat %x, %b {dim = 0}"), "2:3",
      "graph.concat: operand 1, tensor<8xf32>, does not fit operand 0, tensor<4x8xf32>: "
      "operands have one rank and equal sizes in every dimension but 0"),
    C("concat-dim", fn("  %y = graph.concat %x, %x {dim = 2}"), "2:3",
      "graph.concat: dim entry 2 is out of range for a rank-2 operand (valid: -2..1)"),
    C("iota-element", fn("  %y = graph.iota {dim = 0} : tensor<4xi1>"), "2:3",
      "graph.iota makes i32, i64 or floating-point tensors, not tensor<4xi1>"),
    C("iota-rank-0", fn("  %y = graph.iota {dim = 0} : tensor<i32>"), "2:3",
      "graph.iota needs a result of rank 1 or more"),
    C("iota-dim", fn("  %y = graph.iota {dim = 1} : tensor<4xi32>"), "2:3",
      "graph.iota: dim entry 1 is out of range for a rank-1 operand (valid: -1..0)"),
    C("iota-i32", fn("  %y = graph.iota {dim = 0} : tensor<3000000000xi32>"), "2:3",
      "graph.iota: indices up to 2999999999 do not fit in i32"),
    C("index-select-float-indices", fn("  %y = graph.index_select %x, %x {dim = 0}"), "2:3",
      "graph.index_select: indices must be an i32 or i64 tensor, got tensor<4x8xf32> "
      "(use graph.cast to convert)"),
    C("index-select-rank-0", fn("  %y = graph.index_select %s, %i {dim = 0}"), "2:3",
      "graph.index_select needs an input of rank 1 or more"),
    C("gather-rank", fn("  %y = graph.gather %b, %i {dim = 0}"), "2:3",
      "graph.gather: indices tensor<4x8xi32> must have the rank of the input tensor<8xf32> "
      "and no larger sizes in every dimension but 0"),
    C("gather-dim", fn("  %y = graph.gather %x, %i {dim = 2}"), "2:3",
      "graph.gather: dim entry 2 is out of range for a rank-2 operand (valid: -2..1)"),
    C("gelu-mode", fn('  %y = graph.gelu %x {approximate = "fast"}'), "2:3",
      'graph.gelu: approximate is "none" or "tanh"'),
    # --- graph ops: matmul and composites -----------------------------------------------------
    C("matmul-rank", fn("  %y = graph.matmul %x, %b"), "2:3",
      "graph.matmul takes [M,K]x[K,N] or [B,M,K]x[B,K,N], got tensor<4x8xf32> and tensor<8xf32>"),
    C("matmul-inner", fn("  %y = graph.matmul %x, %x"), "2:3",
      "graph.matmul: inner dimensions differ: tensor<4x8xf32> has K=8, tensor<4x8xf32> has K=4"),
    C("matmul-batch", fn("  %a = graph.reshape %x : tensor<2x2x8xf32>",
                         "  %t = graph.reshape %x : tensor<4x8x1xf32>", "  %y = graph.matmul %a, %t"),
      "4:3", "graph.matmul: batch dimensions differ: 2 and 4"),
    C("softmax-dim", fn("  %y = graph.softmax %x {dim = 2}"), "2:3",
      "graph.softmax: dim entry 2 is out of range for a rank-2 operand"),
    C("layer-norm-dims", fn("  %y = graph.layer_norm %x, %b, %b {dims = [0]}"), "2:3",
      "graph.layer_norm normalizes trailing dimensions: dims must be the last ones of a rank-2 "
      "input, like [1]"),
    C("layer-norm-rank0", fn("  %y = graph.layer_norm %s, %s, %s {dims = []}"), "2:3",
      "graph.layer_norm needs an input of rank 1 or more"),
    C("layer-norm-weight", fn("  %y = graph.layer_norm %x, %x, %b {dims = [1]}"), "2:3",
      "graph.layer_norm: weight must have the normalized shape [8], got tensor<4x8xf32>"),
    C("layer-norm-bias", fn("  %y = graph.layer_norm %x, %b, %x {dims = [1]}"), "2:3",
      "graph.layer_norm: bias must have the normalized shape [8], got tensor<4x8xf32>"),
    C("attention-arity", fn("  %y = graph.attention %x, %x"), "2:3",
      "graph.attention takes query, key, value and an optional mask, got 2 operands"),
    C("attention-rank", fn("  %y = graph.attention %b, %b, %b"), "2:3",
      "graph.attention: query, key and value have one rank, 2 to 4, got tensor<8xf32>"),
    C("attention-key", fn("  %k = graph.reshape %x : tensor<8x4xf32>", "  %y = graph.attention %x, %k, %k"),
      "3:3", "graph.attention: key's last dim (4) must be the query's (8)"),
    C("attention-value", fn("  %v = graph.reshape %x : tensor<8x4xf32>", "  %y = graph.attention %x, %x, %v"),
      "3:3", "graph.attention: value tensor<8x4xf32> must have the key's leading dims and length"),
    C("attention-heads", fn("  %q = graph.reshape %x : tensor<2x2x8xf32>",
                            "  %k = graph.reshape %x : tensor<4x1x8xf32>", "  %y = graph.attention %q, %k, %k"),
      "4:3", "graph.attention: the key's leading dims [4] must be the query's [2] (or divide its heads"),
    C("attention-mask-type", fn("  %y = graph.attention %x, %x, %x, %i"), "2:3",
      "graph.attention: the mask is i1 or the query's type, got tensor<4x8xi32>"),
    C("attention-mask-shape", fn("  %y = graph.attention %x, %x, %x, %b"), "2:3",
      "graph.attention: mask tensor<8xf32> does not broadcast to the scores' shape [4, 4]"),
    # --- fusion groups ----------------------------------------------------------------------
    C("fused-arity", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>, %q: tensor<4x8xf32>) {",
                        "    graph.yield %a", "  } : tensor<4x8xf32>"), "2:3",
      "graph.fused has 1 operand but its region takes 2 arguments"),
    C("fused-arg-type", fn("  %y = graph.fused %x (%a: tensor<4x8xf16>) {", "    graph.yield %a",
                           "  } : tensor<4x8xf16>"), "2:3",
      "graph.fused: region argument type tensor<4x8xf16> differs from operand type tensor<4x8xf32>"),
    C("fused-isolated", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {",
                           "    %e = graph.add %a, %b", "    graph.yield %e", "  } : tensor<4x8xf32>"),
      "2:3", "graph.fused: graph.add in the region uses %b, defined outside it (the region sees only"),
    C("fused-yield", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {", "    %e = graph.exp %a",
                        "  } : tensor<4x8xf32>"), "2:3", "graph.fused: the region must end in graph.yield"),
    C("fused-types", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {", "    graph.yield %a",
                        "  } : tensor<8x4xf32>"), "2:3",
      "graph.fused: graph.yield types (tensor<4x8xf32>) differ from the results (tensor<8x4xf32>)"),
    C("rank-too-high", "func @f(%x: tensor<" + "1x" * 65 + "f32>) {\n  return\n}\n", "1:20",
      "'tensor<...>' has 65 dimensions, more than irc supports (64)"),
    C("regions-too-deep",
      "func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
      + "".join(f"  loop.foreach {{bounds = [1]}} (%i{d}: index) {{\n" for d in range(65))
      + "  }\n" * 65 + "  return %x : tensor<4xf32>\n}\n",
      "66:31", "regions nest more than 64 deep"),
    C("fused-nested", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {",
                         "    %z = graph.fused %a (%c: tensor<4x8xf32>) {", "      graph.yield %c",
                         "    } : tensor<4x8xf32>", "    graph.yield %z", "  } : tensor<4x8xf32>"),
      "3:5", "graph.fused inside another graph.fused: a group is one kernel and does not nest"),
    C("fused-not-graph-op", fn("  %y = graph.fused %x (%a: tensor<4x8xf32>) {",
                               "    %z = loop.alloc : memref<4xf32>", "    graph.yield %a",
                               "  } : tensor<4x8xf32>"),
      "2:3", "graph.fused: loop.alloc in the region is not a graph op"),
    C("fused-two-reductions", fn("  %y, %z = graph.fused %x (%a: tensor<4x8xf32>) {",
                                 "    %r = graph.reduce_sum %a {dims = [1]}",
                                 "    %c = graph.reduce_sum %a {dims = [0]}", "    graph.yield %r, %c",
                                 "  } : tensor<4xf32>, tensor<8xf32>"),
      "2:3", "graph.fused: one kernel cannot compute this group: reductions over different shapes"),
    C("fused-kind", fn('  %y = graph.fused %x {kind = "reduction"} (%a: tensor<4x8xf32>) {',
                       "    %e = graph.exp %a", "    graph.yield %e", "  } : tensor<4x8xf32>"),
      "2:3", 'graph.fused: kind "reduction", but the group is a "pointwise" kernel'),
    C("fused-kind-unknown", fn('  %y = graph.fused %x {kind = "rows"} (%a: tensor<4x8xf32>) {',
                               "    graph.yield %a", "  } : tensor<4x8xf32>"),
      "2:3", 'graph.fused: kind must be one of "pointwise", "reduction", "contraction", "attention"'),
    C("fused-rows-wrong", fn('  %y = graph.fused %x {space = [4, 8], dims = [0]} (%a: tensor<4x8xf32>) {',
                             "    %r = graph.reduce_sum %a {dims = [1]}", "    graph.yield %r",
                             "  } : tensor<4xf32>"),
      "2:3", "graph.fused: space = [4, 8], dims = [0], but its reductions have space = [4, 8], dims = [1]"),
    C("fused-rows-half", fn('  %y = graph.fused %x {dims = [1]} (%a: tensor<4x8xf32>) {',
                            "    %r = graph.reduce_sum %a {dims = [1]}", "    graph.yield %r",
                            "  } : tensor<4xf32>"),
      "2:3", "graph.fused: 'space' and 'dims' (a reduction kernel's rows) go together"),
    C("fused-rows-bad", fn('  %y = graph.fused %x {space = [4, 8], dims = [1, 1]} (%a: tensor<4x8xf32>) {',
                           "    %r = graph.reduce_sum %a {dims = [1]}", "    graph.yield %r",
                           "  } : tensor<4xf32>"),
      "2:3", "graph.fused: 'space' must be positive sizes and 'dims' increasing dims of it"),
    C("fused-kernel-name", fn('  %y = graph.fused %x {kernel = "a-b"} (%a: tensor<4x8xf32>) {',
                              "    graph.yield %a", "  } : tensor<4x8xf32>"), "2:3",
      'graph.fused: kernel name "a-b" is not an identifier (ASCII letters, digits and _'),
    C("fused-kernel-string", fn("  %y = graph.fused %x {kernel = 1} (%a: tensor<4x8xf32>) {",
                                "    graph.yield %a", "  } : tensor<4x8xf32>"), "2:3",
      'graph.fused: kernel must be a string, like "poi_exp_0"'),
    # --- the verifier after parsing -----------------------------------------------------------
    C("return-signature", H + "  return %b : tensor<8xf32>\n}\n", "2:3",
      "return value 0 (%b) has type tensor<8xf32> but @f declares tensor<4x8xf32>"),
    C("return-arity", H + "  return\n}\n", "2:3", "return gives 0 value(s) but @f declares 1"),
    C("xdsl-trait", fn("  graph.yield %x"), "2:3",
      "'graph.yield' must be the last operation in its parent block"),
]


def _run_cli(tmp_path: Path, source: str, *args: str) -> tuple[int, str, str, Path]:
    import contextlib
    import io

    path = tmp_path / "t.ir"
    path.write_bytes(source.encode("utf-8", "surrogateescape"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = irc.tools.opt.run([str(path), *args])
    return status, out.getvalue(), err.getvalue(), path


def _source_bytes(case: Case) -> bytes:
    # Cases with non-UTF-8 content spell their bytes as latin-1 characters.
    return case.source.encode("latin-1") if "\xff" in case.source else case.source.encode()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_error_is_located_and_formatted(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "t.ir"
    path.write_bytes(_source_bytes(case))
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = irc.tools.opt.run([str(path)])
    lines = err.getvalue().split("\n")
    assert status == 1, err.getvalue()
    assert out.getvalue() == ""
    head = f"{path}:{case.where}: error: "
    assert lines[0].startswith(head), f"expected {head!r}\n{err.getvalue()}"
    assert case.message in lines[0], err.getvalue()
    # The source line and a caret under the column follow.
    line_no, col = (int(n) for n in case.where.split(":"))
    src_lines = _source_bytes(case).decode("utf-8", "replace").split("\n")
    assert 1 <= line_no <= len(src_lines)
    src = src_lines[line_no - 1]
    assert 1 <= col <= len(src) + 1, "the column is past the end of its line"
    shown = "".join(c if c.isprintable() else "?" for c in src.replace("\t", " "))
    if len(shown) <= 160:
        assert lines[1] == shown
        assert lines[2] == " " * (col - 1) + "^"
    else:  # a window of a long line, still with the caret under the column
        assert lines[1].startswith("...") or lines[1].endswith("...")
        caret = lines[2].index("^")
        assert lines[1][caret] == shown[col - 1]
    assert "Traceback" not in err.getvalue()
    assert not LARK_NAMES.search(lines[0]), lines[0]


# --- errors only a program (or a pass) can produce -------------------------------------


def _tensor(*shape: int, element=F32) -> TensorType:  # type: ignore[no-untyped-def]
    return TensorType(element, list(shape))


def _module(ops: list, args: list, results: list) -> ModuleOp:  # type: ignore[type-arg]
    block = Block(arg_types=args)
    built = [op(block.args) if callable(op) else op for op in ops]
    block.add_ops(built)
    f = func.FuncOp("g", FunctionType.from_lists(args, results), Region(block))
    f.location = Location("api.ir", 1, 1).to_attr()
    return ModuleOp([f])


def _messages_of(build) -> list[str]:  # type: ignore[no-untyped-def]
    with pytest.raises(IrcError) as info:
        verify(build())
    return [d.message for d in info.value.diagnostics]


def api_use_before_def() -> ModuleOp:
    t = _tensor(4)
    block = Block(arg_types=[t])
    first = graph.ExpOp(block.args[0])
    second = graph.NegOp(first)
    block.add_ops([second, first, func.ReturnOp(second)])  # second uses first too early
    f = func.FuncOp("g", FunctionType.from_lists([t], [t]), Region(block))
    return ModuleOp([f])


def api_no_return() -> ModuleOp:
    t = _tensor(4)
    block = Block(arg_types=[t])
    block.add_op(graph.ExpOp(block.args[0]))
    return ModuleOp([func.FuncOp("g", FunctionType.from_lists([t], [t]), Region(block))])


def _constant(result_type, **props) -> ModuleOp:  # type: ignore[no-untyped-def]
    op = graph.ConstantOp.create(result_types=[result_type], properties=props)
    return ModuleOp([op])


def api_constant_not_tensor() -> ModuleOp:
    # IRDL rejects a non-tensor result before the op's own check; the check is
    # public for passes that build ops, so it is called as they would.
    from xdsl.dialects.builtin import MemRefType

    try:
        graph.ConstantOp.check_written_type([], {"value": FloatAttr(1.0, f64)}, MemRefType(f32, [4]))
    except graph.GraphVerifyError as e:
        raise IrcError(Diagnostic(None, str(e))) from None
    raise AssertionError("accepted a memref constant")


def api_iota_not_tensor() -> ModuleOp:
    from xdsl.dialects.builtin import IntegerAttr, MemRefType, i64

    try:
        graph.IotaOp.check_written_type([], {"dim": IntegerAttr(0, i64)}, MemRefType(f32, [4]))
    except graph.GraphVerifyError as e:
        raise IrcError(Diagnostic(None, str(e))) from None
    raise AssertionError("accepted a memref iota")


def api_constant_zero_dim() -> ModuleOp:
    return _constant(_tensor(0, 4), value=FloatAttr(1.0, f64))


def api_operand_zero_dim() -> ModuleOp:
    """An embedder's function over an empty tensor (the parser refuses one)."""
    t = _tensor(3, 0)
    block = Block(arg_types=[t])
    neg = graph.NegOp.create(operands=[block.args[0]], result_types=[t])
    block.add_ops([neg, func.ReturnOp(neg)])
    return ModuleOp([func.FuncOp("g", FunctionType.from_lists([t], [t]), Region(block))])


def api_constant_too_big() -> ModuleOp:
    return _constant(_tensor(2**25, 2**25), value=FloatAttr(1.0, f64))


def api_reshape_not_tensor() -> ModuleOp:
    from xdsl.dialects.builtin import MemRefType

    try:
        graph.ReshapeOp.check_written_type([_tensor(4)], {}, MemRefType(f32, [4]))
    except graph.GraphVerifyError as e:
        raise IrcError(Diagnostic(None, str(e))) from None
    raise AssertionError("accepted a memref reshape")


def api_yield_outside_fused() -> ModuleOp:
    from xdsl.dialects.test import TestOp

    source = TestOp.create(result_types=[_tensor(4)])
    return ModuleOp([source, graph.YieldOp.create(operands=[source.results[0]])])


def api_multiline_xdsl_message() -> ModuleOp:
    from xdsl.dialects.test import TestOp

    source = TestOp.create(result_types=[_tensor(4)])
    bad = graph.ExpOp.create(operands=[source.results[0]], result_types=[f32])
    return ModuleOp([source, bad])


API_CASES = [
    (api_use_before_def, "this value is used before it is defined"),
    (api_no_return, "function @g must end with 'return'"),
    (api_constant_not_tensor, "graph.constant must produce a tensor, got memref<4xf32>"),
    (api_constant_zero_dim, "tensor<0x4xf32>: dimensions must be positive"),
    (api_operand_zero_dim, "graph.neg: operand 0 is tensor<3x0xf32>: dimensions must be positive"),
    (api_constant_too_big, "tensor<33554432x33554432xf32> has more than 2**48 elements"),
    (api_reshape_not_tensor, "graph.reshape must produce a tensor, got memref<4xf32>"),
    (api_iota_not_tensor, "graph.iota must produce a tensor, got memref<4xf32>"),
    (api_yield_outside_fused, "graph.yield may only end the region of a graph.fused op"),
    (api_multiline_xdsl_message, "result 'result' at position 0 does not verify: f32 should be"),
]


@pytest.mark.parametrize(("build", "message"), API_CASES, ids=[b.__name__ for b, _ in API_CASES])
def test_verifier_errors_of_built_ir(build, message: str) -> None:  # type: ignore[no-untyped-def]
    messages = _messages_of(build)
    assert any(message in m for m in messages), messages
    assert all("\n" not in m for m in messages)


def test_verifier_reports_every_error_of_a_module() -> None:
    text = fn("  %y = graph.exp %x : tensor<4x8xf16>") + fn("  %y = graph.neg %x : tensor<8x4xf32>")
    text = text.replace("func @f", "func @g", 1)
    module = parse_unverified(text)
    with pytest.raises(IrcError) as info:
        verify(module)
    assert [d.location.line for d in info.value.diagnostics] == [2, 6]  # type: ignore[union-attr]


def parse_unverified(text: str) -> ModuleOp:
    return parse(text, "t.ir")


def test_verifier_names_the_pass_that_broke_the_ir() -> None:
    module = parse(fn("  %y = graph.exp %x"), "t.ir")

    @dataclasses.dataclass(frozen=True)
    class Breaker(ModulePass):
        name = "breaker"

        def apply(self, ctx: Context, op: ModuleOp) -> None:
            exp = next(o for o in op.walk() if isinstance(o, graph.ExpOp))
            exp.results[0]._type = _tensor(3)  # pyright: ignore[reportPrivateUsage]

    with pytest.raises(IrcError) as info:
        run_pipeline(module, [Breaker()])
    message = info.value.diagnostics[0].message
    assert message.startswith("after pass 'breaker': graph.exp: result type tensor<3xf32>")
    assert info.value.diagnostics[0].location == Location("t.ir", 2, 3)


# --- pipelines and the command line ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptionsPass(ModulePass):
    """A pass with options of each kind, to test their errors."""

    name = "options-pass"
    size: int = 4
    ratio: float = 0.5
    check: bool = False
    label: str = "x"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        return None


@dataclasses.dataclass(frozen=True)
class ExplodingPass(ModulePass):
    name = "explode"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        raise RuntimeError("boom")


PIPELINE_CASES = [
    ("decompose{", "malformed pass pipeline 'decompose{' at column 11: expected argument name here"),
    ("decompose,,", "malformed pass pipeline 'decompose,,' at column 11: expected pass name here"),
    ("nope", "unknown pass 'nope' (available: "),
    ("decompose{x=1}", "pass 'decompose' has no option 'x' (it takes no options)"),
    ("options-pass{sise=1}", "pass 'options-pass' has no option 'sise' (its options: size, ratio, "),
    ("options-pass{size=1.5}", "pass 'options-pass': option 'size' must be an integer, got 1.5"),
    ("options-pass{ratio=true}", "pass 'options-pass': option 'ratio' must be a number, got true"),
    ("options-pass{check=3}", "pass 'options-pass': option 'check' must be true or false, got 3"),
    ("options-pass{size}", "pass 'options-pass': option 'size' must be an integer, got nothing"),
    ("options-pass{label=1,2}", "bad options for pass 'options-pass': "),
    ("tile{block=512 block=1024}",
     "pass 'tile': option 'block' is given twice (at column 16 of 'tile{block=512 block=1024}')"),
    ("split-reduction{min-chunk=1 min_chunk=2}", "pass 'split-reduction': option 'min_chunk' is given twice"),
    ("split-reduction{min-chunk=0}", "split-reduction: 'min-chunk' must be at least 1, got 0"),
    ("split-reduction{threshold=-1}", "split-reduction: 'threshold' must be at least 0, got -1"),
    ("fuse{max-ops=-1}", "fuse: 'max-ops' must be at least 1, got -1"),
    ("fuse{report=xml}", "fuse: 'report' must be text or json, got 'xml'"),
    ("tile{block=2097152}", "tile: 'block' must be at most 1048576 (Triton's largest block), got 2097152"),
    # MLIR's anchored form: one builtin.module, no nested pass managers.
    ("builtin.module(decompose{)",
     "malformed pass pipeline 'builtin.module(decompose{)' at column 26: expected argument name here"),
    ("builtin.module(decompose", "malformed pass pipeline 'builtin.module(decompose': expected ')' at its "
     "end, closing 'builtin.module('"),
    ("builtin.module(func.func(decompose))", "pass pipeline 'builtin.module(func.func(decompose))' nests a "
     "pass manager 'func.func(...)' at column 16: irc's passes run on the whole module, list them "
     "directly in builtin.module(...)"),
    ("func.func(decompose)", "pass pipeline 'func.func(decompose)' is anchored on 'func.func': irc's "
     "passes run on the whole module, write builtin.module(PASS,...)"),
]


@pytest.fixture
def extra_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, "options-pass", lambda: OptionsPass)
    monkeypatch.setitem(PASSES, "explode", lambda: ExplodingPass)


@pytest.mark.parametrize(("spec", "message"), PIPELINE_CASES, ids=[s for s, _ in PIPELINE_CASES])
def test_pipeline_errors(spec: str, message: str, extra_passes: None, tmp_path: Path) -> None:
    with pytest.raises(IrcError) as info:
        build_pipeline(spec)
    assert message in info.value.diagnostics[0].message
    assert info.value.diagnostics[0].location is None
    status, out, err, _ = _run_cli(tmp_path, fn(), "-p", spec)
    assert status == 1 and out == ""
    assert err == f"irc-opt: error: {info.value.diagnostics[0].message}\n"


MALFORMED_ANNOTATIONS = [
    ("  // expected-eror {{unknown op}}", "2:6",
     "unknown annotation 'expected-eror' (did you mean expected-error?)"),
    ("  // expected-somethingelseentirely {{unknown op}}", "2:6",
     "unknown annotation 'expected-somethingelseentirely' (write expected-error, expected-note, "
     "expected-warning)"),
    ("  // expected-error@+x {{unknown op}}", "2:20",
     "bad line offset '@+x' in expected-error (write @+N, @-N, @above or @below)"),
    ("  // expected-error@+1 unknown op", "2:6", "expected-error: its message in {{...}} is missing"),
    ("  // expected-error@+1 {{unknown op", "2:6",
     "expected-error: its message in {{...}} is not closed by }}"),
    ("  // expected-error@-5 {{unknown op}}", "2:6",
     "expected-error points at line -3, outside this input (lines 1-5)"),
]


@pytest.mark.parametrize(
    ("annotation", "where", "message"), MALFORMED_ANNOTATIONS, ids=[a for a, _, _ in MALFORMED_ANNOTATIONS]
)
def test_malformed_annotations_are_errors(annotation: str, where: str, message: str, tmp_path: Path) -> None:
    """--verify-diagnostics: an annotation it cannot read is an error at the annotation,
    not silently skipped (the test would then pass without checking anything)."""
    source = H + annotation + "\n" + "  %y = graph.expp %x\n" + R
    status, out, err, path = _run_cli(tmp_path, source, "--verify-diagnostics")
    assert status == 1 and out == ""
    assert err.split("\n")[0] == f"{path}:{where}: error: {message}", err


def test_good_options_are_passed_on(extra_passes: None) -> None:
    (p,) = build_pipeline("options-pass{size=8 ratio=2 check=true label=y}")
    assert p == OptionsPass(size=8, ratio=2.0, check=True, label="y")


def test_internal_error_names_the_pass(extra_passes: None, tmp_path: Path) -> None:
    status, out, err, _ = _run_cli(tmp_path, fn(), "-p", "decompose,explode")
    assert status == 2 and out == ""
    assert err == (
        "irc-opt: internal error in pass 'explode': RuntimeError: boom "
        "(run with --debug for the traceback)\n"
    )
    # The per-pass flag exists for registered passes too.
    status, _, err, _ = _run_cli(tmp_path, fn(), "--explode")
    assert status == 2 and "in pass 'explode'" in err and "Traceback" not in err


def test_internal_error_traceback_only_with_debug(extra_passes: None, tmp_path: Path) -> None:
    status, _, err, _ = _run_cli(tmp_path, fn(), "--explode", "--debug")
    assert status == 2
    assert "Traceback (most recent call last)" in err
    assert "RuntimeError: boom" in err
    assert err.rstrip().endswith("irc-opt: internal error in pass 'explode': RuntimeError: boom")


def test_internal_error_outside_a_pass(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def broken(module: ModuleOp) -> str:
        raise KeyError("printer")

    monkeypatch.setitem(irc.tools.opt.EMITTERS, "ir", broken)
    status, _, err, _ = _run_cli(tmp_path, fn())
    assert status == 2
    assert err == (
        "irc-opt: internal error outside any pass: KeyError: 'printer' "
        "(run with --debug for the traceback)\n"
    )


CLI_CASES = [
    (["-p", "loop-to-tile"], "irc-opt: error: pass 'loop-to-tile' runs on loop-level IR, but this "
     "module is at the graph level (run graph-to-loop first)"),
    (["-p", "graph-to-loop,fuse"], "irc-opt: error: pass 'fuse' runs on graph-level IR, but this "
     "module is at the loop level (it runs before graph-to-loop)"),
    (["--fusion-report"], "irc-opt: error: --fusion-report describes the fuse pass: add --fuse"),
    (["--autotune"], "irc-opt: error: --autotune chooses kernel tilings: use it with --emit triton"),
    (
        ["--autotune", "--emit", "triton"],
        "irc-opt: error: --autotune measures kernels on a CUDA GPU; none is available",
    ),
]


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize(("args", "message"), CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_option_errors(args: list[str], message: str, no_gpu: None, tmp_path: Path) -> None:
    status, out, err, _ = _run_cli(tmp_path, fn(), *args)
    assert status == 1 and out == ""
    assert err == message + "\n"


def test_unreadable_and_unwritable_files(tmp_path: Path) -> None:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = irc.tools.opt.run([str(tmp_path / "missing.ir")])
    assert status == 1
    assert err.getvalue() == (
        f"irc-opt: error: cannot read '{tmp_path / 'missing.ir'}': No such file or directory\n"
    )
    status, _, err2, _ = _run_cli(tmp_path, fn(), "-o", str(tmp_path / "no" / "such" / "dir"))
    assert status == 1
    assert err2 == (
        f"irc-opt: error: cannot write '{tmp_path / 'no' / 'such' / 'dir'}': "
        "No such file or directory\n"
    )
    with pytest.raises(IrcError) as info:
        read_source(str(tmp_path / "missing.ir"))
    assert info.value.diagnostics[0].message.startswith("cannot read ")


def test_verify_diagnostics_reports_mismatches(tmp_path: Path) -> None:
    source = (
        H
        + "  // expected-error@+1 {{this text is not in the message}}\n"
        + "  %y = graph.expp %x\n"
        + R
        + "// -----\n"
        + H
        + "  // expected-error@below {{undefined value}}\n"
        + "  %y = graph.exp %q\n"
        + R
    )
    status, out, err, path = _run_cli(tmp_path, source, "--split-input-file", "--verify-diagnostics")
    assert status == 1 and out == ""
    lines = err.split("\n")
    assert lines[0] == f"{path}:3:8: error: unexpected error: unknown op 'graph.expp' (did you mean graph.exp?)"
    assert lines[3].startswith(f"{path}:2:3: error: expected error \"this text is not in the message\" was not produced")


def test_cli_subprocess_exit_status_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ir"
    bad.write_text(fn("  %y = graph.exp %x : tensor<4x8xf32> %y"))
    exe = Path(sys.executable).parent / "irc-opt"
    proc = subprocess.run([str(exe), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"{bad}:2:39: error: unexpected '%y' after the op")
    assert "Traceback" not in proc.stderr
    binary = tmp_path / "binary.ir"
    binary.write_bytes(bytes(range(256)))
    proc = subprocess.run([str(exe), str(binary)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "error: the file is not UTF-8 text" in proc.stderr and "Traceback" not in proc.stderr


def test_diagnostics_without_a_place_and_with_notes() -> None:
    sources = SourceManager()
    sources.add("a.ir", "line one\nline\ttwo\r\n")
    plain = Diagnostic(None, "something is wrong")
    assert sources.format(plain) == "error: something is wrong"
    d = Diagnostic(Location("a.ir", 2, 6), "bad", notes=[])
    assert sources.format(d) == "a.ir:2:6: error: bad\nline two\n     ^"
    # A location past the known lines prints the head alone.
    assert sources.format(Diagnostic(Location("a.ir", 9, 1), "x")) == "a.ir:9:1: error: x"
    # Chunks of a split file land on their own lines.
    sources.add("b.ir", "first\n", 1)
    sources.add("b.ir", "fifth\n", 5)
    assert sources.line(Location("b.ir", 5, 1)) == "fifth"
    assert sources.line(Location("b.ir", 3, 1)) == ""


def test_decode_reports_the_place_of_a_bad_byte() -> None:
    with pytest.raises(IrcError) as info:
        decode_source(b"ok\nab\xc3(", "x.ir")
    d = info.value.diagnostics[0]
    assert d.location == Location("x.ir", 2, 3)
    assert d.message == "the file is not UTF-8 text (byte 0xc3 at offset 5)"


# --- every message in the source has a case above -------------------------------------------------

SOURCES = ["irc/syntax/parser.py", "dialects/graph.py", "irc/analysis/verifier.py", "irc/tools/opt.py", "irc/pipeline.py"]
MESSAGE_CALLS = {"at": 1, "error": 1, "Diagnostic": 1, "Note": 1, "GraphVerifyError": 0,
                 "VerifyException": 0}
UNREACHABLE = {
    # lark raises only UnexpectedInput subclasses for bad input; other LarkErrors
    # would be grammar bugs, and the LALR parser does not recurse.
    "cannot parse: ",
    "the input is nested too deeply",
}


def _regex(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            re.escape(v.value) if isinstance(v, ast.Constant) else ".*?" for v in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _regex(node.left) + _regex(node.right)
    if isinstance(node, ast.IfExp):
        return f"(?:{_regex(node.body)}|{_regex(node.orelse)})"
    return ".*?"


def _message_nodes(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", ""
            )
            index = MESSAGE_CALLS.get(name)
            if index is not None and len(node.args) > index:
                yield node.args[index]
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_explain"):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Return) and sub.value is not None:
                    yield sub.value


def message_templates() -> dict[str, str]:
    """Regex of each message template -> where it is, for every file in SOURCES."""
    out: dict[str, str] = {}
    for rel in SOURCES:
        tree = ast.parse((ROOT / rel).read_text())
        for node in _message_nodes(tree):
            regex = _regex(node)
            literal = re.sub(r"\\.|\.\*\?|\(\?:|\||\)", "", regex)
            if len(literal) >= 4:  # a template with words in it
                out[regex] = f"{rel}:{node.lineno}"
    return out


def _produced_messages(tmp_path: Path) -> list[str]:
    import contextlib
    import io

    messages: list[str] = []
    for case in CASES:
        path = tmp_path / f"{case.id}.ir"
        path.write_bytes(_source_bytes(case))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            irc.tools.opt.run([str(path)])
        messages += [m.split(": error: ", 1)[-1].split(": note: ", 1)[-1] for m in err.getvalue().split("\n")]
    for build, _ in API_CASES:
        messages += _messages_of(build)
    for spec, _ in PIPELINE_CASES:
        try:
            build_pipeline(spec)
        except IrcError as e:
            messages += [d.message for d in e.diagnostics]
    for annotation, _, _ in MALFORMED_ANNOTATIONS:
        err = _run_cli(tmp_path, H + annotation + "\n" + R, "--verify-diagnostics")[2]
        messages += [m.split(": error: ", 1)[-1] for m in err.split("\n")]
    # Notes and the cases of the tests above that are not in the table.
    module_notes = parse_notes()
    messages += module_notes
    messages += [
        "unexpected error: x",
        'expected error "x" was not produced',
        "cannot read 'x': No such file",
        "cannot write 'x': No such file",
        "after pass 'x': y",
    ]
    return messages


def parse_notes() -> list[str]:
    """The notes attached to errors (first definitions and the like)."""
    notes: list[str] = []
    for text in [
        fn("  %y = graph.exp %x", "  %y = graph.exp %x"),
        fn("  %y = graph.exp %z", "  %z = graph.exp %x"),
        H + R + H + R,
        fn("  %y = graph.exp %m"),
        H + "  return %b : tensor<8xf32>\n}\n",
        H + "  return %x, %x : tensor<4x8xf32>, tensor<4x8xf32>\n}\n",
        fn("  %c = graph.constant {value = 1.0} : tensor<5xf32>", "  %y = graph.add %x, %c"),
    ]:
        try:
            verify(parse(text, "n.ir"))
        except IrcError as e:
            notes += [n.message for d in e.diagnostics for n in d.notes]
    notes += [n.message for d in _verifier_note_diags() for n in d.notes]
    return notes


def _verifier_note_diags() -> list[Diagnostic]:
    # The verifier's own note on an operand, for IR whose type a pass changed.
    module = parse(fn("  %y = graph.add %x, %b"), "v.ir")
    add = next(o for o in module.walk() if isinstance(o, graph.AddOp))
    add.operands[1]._type = _tensor(5)  # type: ignore[attr-defined]  # pyright: ignore
    try:
        verify(module)
    except IrcError as e:
        return e.diagnostics
    raise AssertionError("the verifier accepted a broken add")


def test_every_message_is_provoked(tmp_path: Path, extra_passes: None, no_gpu: None) -> None:
    templates = message_templates()
    assert len(templates) > 100
    produced = _produced_messages(tmp_path)
    for args, _ in CLI_CASES:
        produced += _run_cli(tmp_path, fn(), *args)[2].split("\n")
    missing = []
    for regex, where in templates.items():
        if any(re.search(regex, m) for m in produced):
            continue
        if any(u in regex.replace("\\", "") for u in UNREACHABLE):
            continue
        missing.append(f"{where}: {regex}")
    assert not missing, "messages no test provokes:\n" + "\n".join(missing)


def test_the_unreachable_list_is_current() -> None:
    text = "".join((ROOT / rel).read_text() for rel in SOURCES)
    for fragment in UNREACHABLE:
        assert fragment in text
