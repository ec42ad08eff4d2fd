"""Programs on the mesh are judged by the grader's checker, not in the student's kernel.

The kernel only exports each case's program (``jax.export``) or, for an answer that is
data (PartitionSpecs), hands back the data; the checker compiles the program itself, runs
it on input values of its own and reads the collectives from what it compiled. Here the
real collector cell runs in this process on the chapters' right and wrong answers, and the
checker's verdict must equal the notebook's own check; then forged programs are refused.
"""

import base64
import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import test_exercises_ch03 as ch3
import test_exercises_ch05 as ch5
import test_exercises_ch09 as ch9
import test_exercises_ch10 as ch10
from scalebook import grade
from scalebook.exercises import evaluate, get_exercise


def collect(ex_id, answer, tmp_path):
    """What the grader's collector cell records for ``answer`` (through JSON, as in a run)."""
    ns = {"the_answer": answer}
    exec(grade._COLLECTOR, ns)
    path = tmp_path / f"records-{ex_id}-{id(answer)}.jsonl"
    ns["_scalebook_grader_collect"]([{"id": ex_id, "answer": "the_answer", "how": "program"}],
                                    str(path), 10.0)
    return json.loads(path.read_text().splitlines()[0])


def judged(ex_id, rec, seed=7):
    return grade.check_records([{"id": ex_id, "how": "program", "rec": rec, "seed": seed}])[ex_id]


ANSWERS = ([("3.10", f) for f in (ch3.fsdp_right, ch3.fsdp_all_reduce, ch3.fsdp_varying,
                                  ch3.fsdp_one_shape, ch3.fsdp_none, ch3.fsdp_forgot_return)]
           + [("3.11", f) for f in (ch3.rs_right, ch3.rs_all_reduce_slice, ch3.rs_wrong_dim)]
           + [(k, v) for k, v in sorted(ch10.CODE_RIGHT.items())]
           + [(k, a) for k, v in sorted(ch10.CODE_WRONG.items()) for a, _ in v]
           + [("10.7", ch10.cm_fori_loop)]
           # chapter 5's right and wrong programs, as its tests parametrise them
           + [(e, a) for e, a, *_ in (ch5.test_right_programs_pass.pytestmark[0].args[1]
                                      + ch5.test_wrong_programs_fail_with_a_reason
                                      .pytestmark[0].args[1])
              if e in ("5.13", "5.14", "5.15", "5.17") and callable(a)]
           + [("9.7", lambda x, w1, w2: jnp.maximum(x @ w1, 0) @ w2), ("9.7", ch9.mlp_slow),
              ("9.7", ch9.mlp_replicated_out), ("9.7", lambda x, w1, w2: (x @ w1) @ w2)])


@pytest.mark.parametrize("ex_id,answer", ANSWERS,
                         ids=[f"{e}-{i}" for i, (e, _) in enumerate(ANSWERS)])
def test_the_checker_agrees_with_the_notebooks_check(ex_id, answer, tmp_path):
    want = evaluate(ex_id, answer)
    status, message, _ = judged(ex_id, collect(ex_id, answer, tmp_path))
    assert (status, message) == (want.status, want.message)


def test_a_program_that_returns_constants_fails_on_the_checkers_inputs(tmp_path):
    """A program that returns the published inputs' product as a constant passes in the
    kernel's inputs only: the checker draws its own values."""
    ex = get_exercise("3.10")
    from scalebook.mesh import make_mesh
    mesh = make_mesh(ex.mesh_shape, ex.mesh_axes)
    forged = []
    for case in ex.cases:
        fn, args = ex.build(ch3.fsdp_right, case, mesh)
        want = jnp.asarray(ex.expected(case, *args))

        def constant(x, w, want=want):
            return want + 0 * (x.sum() + w.sum())
        out_sharding = jax.sharding.NamedSharding(mesh, P("x", None))
        exp = jax.export.export(jax.jit(constant, out_shardings=out_sharding))(*args)
        forged.append({"program": base64.b64encode(exp.serialize()).decode()})
    status, message, _ = judged("3.10", {"programs": forged})
    assert status == "wrong" and "wrong numbers" in message


def test_a_forged_program_with_other_shapes_a_host_call_or_junk_is_refused(tmp_path):
    ex = get_exercise("3.11")
    from scalebook.mesh import make_mesh
    mesh = make_mesh(ex.mesh_shape, ex.mesh_axes)
    fn, args = ex.build(ch3.rs_right, ex.cases[0], mesh)
    small = jax.export.export(jax.jit(lambda x, w: x @ w))(
        jnp.ones((2, 2), jnp.float32), jnp.ones((2, 2), jnp.float32))
    recs = [{"program": base64.b64encode(small.serialize()).decode()}] * len(ex.cases)
    status, message, _ = judged("3.11", {"programs": recs})
    assert status == "wrong" and "for 1 devices, not 8" in message
    fn1, args1 = ex.build(ch3.rs_right, ex.cases[1], mesh)        # another case's shapes
    other = jax.export.export(fn1)(*args1)
    recs = [{"program": base64.b64encode(other.serialize()).decode()}] * len(ex.cases)
    status, message, _ = judged("3.11", {"programs": recs})
    assert status == "wrong" and "the program takes" in message
    status, message, _ = judged("3.11", {"programs": [{"program": "AAAA"}] * 3})
    assert status == "wrong"
    status, message, _ = judged("3.11", {"programs": "nonsense"})
    assert status == "wrong" and "could not be read back" in message
    # jax.export will not serialize a host callback, but bytes can be forged by hand: the
    # checker reads the custom calls of the module and runs none but sharding markers
    exp = jax.export.export(fn)(*args)

    class Forged:
        def __getattr__(self, name):
            return getattr(exp, name)

        def mlir_module(self):
            return exp.mlir_module() + '\n%0 = stablehlo.custom_call @xla_python_cpu_callback()'

    from scalebook.exercises.kinds import _exported_problem
    assert _exported_problem(exp, args) is None
    assert "xla_python_cpu_callback" in _exported_problem(Forged(), args)


def test_partition_spec_answers_are_data_and_the_checker_builds_the_program(tmp_path):
    rec = collect("10.8", lambda: P("data", None, None, None), tmp_path)
    assert all(p["value"] == {"pspec": ["data", None, None, None]}
               for p in rec["programs"])
    assert judged("10.8", rec)[0] == "correct"
    for spec in (P("data", "model", None, None), P("data", None, "model", None)):
        wrong = collect("10.8", lambda spec=spec: spec, tmp_path)
        assert judged("10.8", wrong)[0] == "wrong"


UPDATES = [lambda: jax.jit(ch9.clipped_update),
           lambda: jax.jit(ch9.branchy_update),
           lambda: jax.jit(lambda w, g, lr: w - lr * g),
           lambda: jax.jit(lambda w, g, lr: w - lr * jnp.clip(g, -1, 1)),
           lambda: jax.jit(ch9.branchy_update, static_argnums=2),
           lambda: (lambda w, g, lr: w - lr * g),
           lambda: jax.jit(lambda w, g, lr: w + lr * g),
           lambda: None, lambda: 1 / 0, lambda: 3]


@pytest.mark.parametrize("answer", UPDATES, ids=[str(i) for i in range(len(UPDATES))])
def test_compile_once_is_judged_from_the_exported_update(answer, tmp_path):
    """9.8 counted the kernel's compilations; the checker reads whether lr is an input of
    the exported program, and runs it with learning rates of its own."""
    want = evaluate("9.8", answer)
    status, message, _ = judged("9.8", collect("9.8", answer, tmp_path))
    assert status == want.status
    for word in ("static", "jitted", "wrong numbers", "not attempted", "raised", "correct"):
        assert (word in message) == (word in want.message) or word == "raised"
