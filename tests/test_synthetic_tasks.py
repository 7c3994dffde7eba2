"""Tests for the synthetic tasks: answers checked by independent computations, splits, formats, errors."""

from __future__ import annotations

import inspect
import random
import sys
from collections import Counter

import numpy as np
import pytest

from nope_lightning.synthetic import (
    ANSWER_MARKER,
    BOS,
    COMPONENTS,
    EOS,
    PAD,
    SEP,
    TASKS,
    Example,
    Vocabulary,
    enabled_components,
    exact_match,
    get_task,
    is_held_out,
    length_bucket,
    make_split,
    parse_answer,
    parse_scratchpad,
    pcfg,
    render_scratchpad,
)
from nope_lightning.synthetic.algorithmic import SORT_SYMBOLS, addition_steps
from nope_lightning.synthetic.core import as_random, number
from nope_lightning.synthetic.pcfg import FUNCTIONS, MAX_FUNCTIONS, MAX_OUTPUT, interpret
from nope_lightning.synthetic.scan import all_commands
from nope_lightning.synthetic.scan import interpret as scan_interpret
from nope_lightning.synthetic.scratchpad import (
    MARKERS,
    SCRATCHPAD_MARKERS,
    STEP_MARKER,
    first_error,
    step,
)
from nope_lightning.synthetic.tasks import is_large

COPY_REVERSE = {
    "copy_repeat": lambda s: s,
    "copy_repeat_2x": lambda s: s + s,
    "copy": lambda s: s,
    "copy_2x": lambda s: [*s, "|", *s],
    "reverse": lambda s: s[::-1],
    "reverse_2x": lambda s: [*s[::-1], "|", *s[::-1]],
    "reverse_copy": lambda s: [*s[::-1], "|", *s],
}


def examples(task: str, per_length: int = 3, scratchpad: str = "none", seed: int = 0) -> list[Example]:
    """A few examples at every default train and test length of ``task``."""
    spec, rng = get_task(task), random.Random(seed)
    lengths = spec.split_lengths("train") + spec.split_lengths("test")
    return [spec.generate(rng, length, scratchpad) for length in lengths for _ in range(per_length)]


def body(example: Example) -> list[str]:
    """The prompt after its ``<instruction> :`` prefix."""
    return example.prompt[example.prompt.index(":") + 1:]


def split_on(tokens: list[str], separator: str) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for token in tokens:
        if token == separator:
            out.append([])
        else:
            out[-1].append(token)
    return out


# --- answers, by independent computation ---------------------------------------------------------

@pytest.mark.parametrize("task", sorted(COPY_REVERSE))
def test_copy_and_reverse(task):
    for example in examples(task):
        sequence = body(example)
        assert len(sequence) == example.length
        assert example.answer == example.target == COPY_REVERSE[task](sequence)
        if "repeat" in task:
            assert len(set(sequence)) == 1


def test_copy_repeat_change():
    for example in examples("copy_repeat_change"):
        verb, source, with_, replacement, _ = example.prompt[:5]
        assert (verb, with_) == ("replace", "with") and source != replacement
        assert body(example) == [source] * example.length
        assert example.answer == [replacement] * example.length


def test_addition():
    for example in examples("addition", per_length=10):
        a, b = ("".join(part) for part in split_on(body(example), "+"))
        assert max(len(a), len(b)) == example.length
        assert example.answer == list(str(int(a) + int(b)))


def test_polynomial():
    for example in examples("polynomial", per_length=10):
        x = int("".join(example.prompt[example.prompt.index("=") + 1: example.prompt.index(":")]))
        terms = split_on(body(example), "+")
        assert len(terms) == example.length and -2 <= x <= 2
        for term in terms:
            assert -3 <= int("".join(term[: term.index("*")])) <= 3 and 0 <= int(term[-1]) <= 3
        assert example.answer == [str(eval(" ".join(body(example)), {"x": x}) % 10)]


def test_sort_numbers():
    for example in examples("sort", per_length=5):
        values = [int("".join(item)) for item in split_on(body(example), ",")]
        assert len(values) == example.length and all(10 <= v <= 9999 for v in values)
        assert [int("".join(item)) for item in split_on(example.answer, ",")] == sorted(values)


def test_sort_symbols_uses_the_fixed_order():
    for example in examples("sort_symbols", per_length=5):
        items = [item[0] for item in split_on(body(example), ",")]
        assert len(items) == example.length
        assert split_on(example.answer, ",") == [[s] for s in sorted(items, key=SORT_SYMBOLS.index)]


def test_summation():
    for example in examples("summation", per_length=10):
        values = [int(v[0]) for v in split_on(body(example), "+")]
        assert len(values) == example.length and all(1 <= v <= 9 for v in values)
        assert example.answer == [str(sum(values) % 10)]


def test_parity():
    for example in examples("parity", per_length=10):
        bits = body(example)
        assert len(bits) == example.length and set(bits) <= {"0", "1"}
        assert example.answer == ["even" if bits.count("1") % 2 == 0 else "odd"]


def resolve(definitions: dict[str, tuple[str, str]], name: str) -> int:
    """The value of a LEGO variable, following its chain of definitions back to the literal 1."""
    sign, source = definitions[name]
    return (-1 if sign == "-" else 1) * (1 if source == "1" else resolve(definitions, source))


def test_lego_resolves_the_chain_and_queries_the_second_half():
    for example in examples("lego", per_length=10):
        clauses = split_on(body(example)[:-3], ",")
        query = body(example)[-2]
        definitions = {name: (sign, source) for name, _, sign, source in clauses}
        assert len(definitions) == example.length
        assert example.answer == ["+" if resolve(definitions, query) > 0 else "-", "1"]
        assert [c[0] for c in clauses].index(query) >= (example.length + 1) // 2


SCAN_PAPER_EXAMPLES = {
    "jump": "JUMP",
    "jump left": "LTURN JUMP",
    "jump twice": "JUMP JUMP",
    "turn left twice": "LTURN LTURN",
    "turn opposite right": "RTURN RTURN",
    "walk around left": "LTURN WALK LTURN WALK LTURN WALK LTURN WALK",
    "turn around right": "RTURN RTURN RTURN RTURN",
    "run and jump": "RUN JUMP",
    "look after walk twice": "WALK WALK LOOK",
    "jump thrice and walk opposite left": "JUMP JUMP JUMP LTURN LTURN WALK",
    "jump opposite left after walk around left": "LTURN WALK LTURN WALK LTURN WALK LTURN WALK LTURN LTURN JUMP",
}


@pytest.mark.parametrize("command", sorted(SCAN_PAPER_EXAMPLES))
def test_scan_interpretation_matches_the_paper(command):
    assert scan_interpret(command.split()) == SCAN_PAPER_EXAMPLES[command].split()


def test_scan_grammar_and_length_split():
    commands = all_commands()
    assert len(commands) == len({tuple(c) for c in commands}) == 20_910
    assert max(len(scan_interpret(c)) for c in commands) == 48
    assert get_task("scan").split_lengths("test") == [26, 27, 28, 30, 32, 33, 36, 40, 48]
    for example in make_split("scan", "train", 200, 0) + make_split("scan", "test", 90, 0):
        assert body(example) in commands
        assert example.answer == scan_interpret(body(example))
        assert len(example.answer) == example.length


PCFG_HAND_EXAMPLES = {
    "copy A1 B2 C3": "A1 B2 C3",
    "reverse A1 B2 C3": "C3 B2 A1",
    "shift A1 B2 C3": "B2 C3 A1",
    "echo A1 B2 C3": "A1 B2 C3 C3",
    "swap_first_last A1 B2 C3 D4": "D4 B2 C3 A1",
    "repeat A1 B2": "A1 B2 A1 B2",
    "append A1 B2 , C3": "A1 B2 C3",
    "prepend A1 B2 , C3": "C3 A1 B2",
    "remove_first A1 B2 , C3 D4": "C3 D4",
    "remove_second A1 B2 , C3 D4": "A1 B2",
    "append swap_first_last A1 B2 C3 , repeat D4 E5": "C3 B2 A1 D4 E5 D4 E5",
    "echo remove_first A1 , reverse B2 C3": "C3 B2 B2",
    "prepend append A1 , B2 , C3": "C3 A1 B2",
}


@pytest.mark.parametrize("program", sorted(PCFG_HAND_EXAMPLES))
def test_pcfg_string_functions(program):
    assert interpret(program.split()) == PCFG_HAND_EXAMPLES[program].split()


def evaluate_right_to_left(program: list[str]) -> list[str]:
    """An independent PCFG SET evaluator: prefix notation read backwards with a stack."""
    unary = {"copy": lambda x: x, "reverse": lambda x: x[::-1], "shift": lambda x: x[1:] + x[:1],
             "echo": lambda x: x + x[-1:], "swap_first_last": lambda x: x[-1:] + x[1:-1] + x[:1],
             "repeat": lambda x: x * 2}
    binary = {"append": lambda x, y: x + y, "prepend": lambda x, y: y + x,
              "remove_first": lambda x, y: y, "remove_second": lambda x, y: x}
    stack, run = [], []
    for token in reversed(program):
        if token in unary or token in binary or token == ",":
            if run:
                stack.append(run)
                run = []
            if token in unary:
                stack.append(unary[token](stack.pop()))
            elif token in binary:
                first, second = stack.pop(), stack.pop()
                stack.append(binary[token](first, second))
        else:
            run = [token, *run]
    assert not run and len(stack) == 1
    return stack[0]


def test_pcfg_programs_have_length_many_functions():
    for example in examples("pcfg", per_length=4):
        program = body(example)
        assert sum(token in FUNCTIONS for token in program) == example.length
        assert example.answer == evaluate_right_to_left(program)
        assert len(example.answer) <= MAX_OUTPUT
        strings = [run for run in split_on([t if t not in FUNCTIONS else "," for t in program], ",") if run]
        assert all(2 <= len(s) <= 5 for s in strings)


def test_pcfg_longest_programs_need_few_frames_from_a_fresh_process():
    """``MAX_FUNCTIONS`` programs are generated and interpreted within 300 frames above the caller (Python's
    default limit is 1000), from an empty size table: filled top-down it needed ~700, and ~150 functions failed."""
    for table in (pcfg._argument_mass, pcfg._call_mass, pcfg._call_options):
        table.cache_clear()  # as in a fresh process
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 300)
    try:
        rng = random.Random(0)
        programs = [body(get_task("pcfg").generate(rng, MAX_FUNCTIONS)) for _ in range(20)]
        chain = interpret(["copy"] * MAX_FUNCTIONS + ["A1", "B2"])  # the deepest nesting MAX_FUNCTIONS allows
    finally:
        sys.setrecursionlimit(limit)
    assert [sum(token in FUNCTIONS for token in program) for program in programs] == [MAX_FUNCTIONS] * 20
    assert chain == ["A1", "B2"]
    with pytest.raises(ValueError, match=f"cannot generate length {MAX_FUNCTIONS + 1}"):
        get_task("pcfg").generate(rng, MAX_FUNCTIONS + 1)


# --- splits --------------------------------------------------------------------------------------

def test_registry_ranges_are_disjoint_and_adjacent():
    assert len(TASKS) == 17
    for spec in TASKS.values():
        assert spec.train_lengths.stop == spec.test_lengths.start, spec.name
        assert set(spec.split_lengths("train")).isdisjoint(spec.split_lengths("test"))
    assert (TASKS["copy"].train_lengths, TASKS["copy"].test_lengths) == (range(1, 21), range(21, 41))
    assert (TASKS["addition"].train_lengths, TASKS["addition"].test_lengths) == (range(1, 9), range(9, 17))
    assert (TASKS["scan"].train_lengths, TASKS["scan"].test_lengths) == (range(1, 26), range(26, 49))


@pytest.mark.parametrize("task", sorted(TASKS))
def test_make_split_lengths_determinism_and_holdout(task):
    spec = TASKS[task]
    train = make_split(task, "train", 200, seed=1)
    valid = make_split(task, "valid", 60, seed=1)
    test = make_split(task, "test", 3 * len(spec.split_lengths("test")), seed=1)
    assert {e.length for e in train + valid} <= set(spec.train_lengths)
    assert set(Counter(e.length for e in test).values()) == {3}  # every test bucket, evenly
    assert make_split(task, "train", 200, seed=1) == train
    assert make_split(task, "train", 200, seed=2) != train
    # Every validation problem at a large length is reserved (never in training); at a small one, none is.
    assert all(is_held_out(e.prompt) == is_large(task, e.length) for e in valid)
    assert not any(is_held_out(e.prompt) for e in train)


def test_train_and_valid_stay_disjoint_across_seeds_and_sizes():
    train = {tuple(e.prompt) for e in make_split("pcfg", "train", 3000, seed=0)}
    valid = {tuple(e.prompt) for e in make_split("pcfg", "valid", 300, seed=7)}
    assert all(is_large("pcfg", length) for length in get_task("pcfg").split_lengths("valid"))
    assert len(valid) > 200 and train.isdisjoint(valid)


def test_length_overrides():
    assert {e.length for e in make_split("copy", "train", 100, 0, train_max_len=5)} <= set(range(1, 6))
    test = make_split("copy", "test", 50, 0, train_max_len=5, test_max_len=9)
    assert sorted({e.length for e in test}) == [6, 7, 8, 9]


def test_addition_training_draws_every_digit_count_pair_equally():
    counts = Counter(e.length for e in make_split("addition", "train", 4000, 0))
    assert 10 < counts[8] / counts[1] < 22  # 15 digit-count pairs have length 8, one has length 1


def test_scratchpad_format_does_not_change_the_problems():
    plain = make_split("addition", "train", 50, 3)
    full = make_split("addition", "train", 50, 3, scratchpad="full")
    assert [e.prompt for e in plain] == [e.prompt for e in full]
    assert [e.answer for e in plain] == [e.answer for e in full]


def test_numpy_generators_are_accepted_and_deterministic():
    spec = get_task("polynomial")
    first = spec.generate(np.random.default_rng(5), 6, "minimal")
    assert first == spec.generate(np.random.default_rng(5), 6, "minimal")
    with pytest.raises(TypeError, match="rng must be"):
        as_random(5)


def test_length_bucket():
    assert length_bucket(24) == "24"
    assert [length_bucket(n, 5) for n in (1, 5, 20, 21, 40)] == ["1-5", "1-5", "16-20", "21-25", "36-40"]
    with pytest.raises(ValueError, match="width"):
        length_bucket(3, 0)


# --- scratchpads ---------------------------------------------------------------------------------

FORMATTED = [(task, fmt) for task, spec in sorted(TASKS.items()) for fmt in spec.scratchpads]


@pytest.mark.parametrize(("task", "fmt"), FORMATTED)
def test_scratchpad_round_trip(task, fmt):
    spec = TASKS[task]
    keep = set(enabled_components(fmt)) & set(spec.components)
    for example in examples(task, per_length=1, scratchpad=fmt):
        steps, answer = parse_scratchpad([*example.target, EOS, PAD], fmt)
        assert answer == example.answer
        assert render_scratchpad(steps, answer, fmt) == example.target
        assert all(set(s) == keep for s in steps)
        assert exact_match(example.target, example)


def test_first_error_names_the_step_and_component_where_a_scratchpad_goes_wrong():
    """By hand on addition's full scratchpad (three steps): a wrong carry, a remainder cut short, the answer after two
    steps, a fourth step, an output that ends mid-step, a step without its input marker, and a wrong or missing final
    answer."""
    gold = render_scratchpad(addition_steps(number(357), number(48)), number(405), "full")
    text = " ".join(gold)

    def at(wrong: str) -> tuple[str, int]:
        return first_error(gold, [*wrong.split(), EOS], "full")

    assert at(text.replace("carry = 1 <rem> 3 +", "carry = 0 <rem> 3 +")) == ("intermediate_variables", 2)
    assert at(text.replace("<rem> 3 5 + 4", "<rem> 3 5 +")) == ("remaining_input", 1)
    assert at(text.split(" <step> <in> 3 , 0")[0] + " <ans> 4 0 5") == ("fewer steps", 3)
    assert at(text.replace(" <ans>", " <step> <in> 0 , 0 <ans>")) == ("more steps", 4)
    assert at(text.split(" <out> 4")[0]) == ("step_computation", 3)  # ends after step 3's computation
    assert at(text.replace("<step> <in> 5 , 4", "<step> 5 , 4")) == ("step_input", 2)
    assert at(text.replace("<ans> 4 0 5", "<ans> 4 1 5")) == ("answer", 3)
    assert at(text.replace(" <ans> 4 0 5", "")) == ("answer", 3)  # every step right, no answer
    assert at("<comp> 7") == ("step_input", 1)
    with pytest.raises(ValueError, match="format 'none' has no steps"):
        first_error(["4"], ["5"], "none")


@pytest.mark.parametrize(("task", "fmt"), [(t, f) for t, f in FORMATTED if f != "none"])
def test_first_error_agrees_with_the_first_differing_token(task, fmt):
    """Oracle: one content token of a scratchpad changed, the first error is the step and component of the first
    token where prediction and target differ (the step counted by <step> markers before it, the component by the
    last marker before it)."""
    rng = random.Random(0)
    markers = {marker: name for name, marker in MARKERS.items()}
    checked = 0
    for example in examples(task, per_length=1, scratchpad=fmt):
        body = example.target[: example.target.index(ANSWER_MARKER)]
        content = [i for i, token in enumerate(body) if token not in SCRATCHPAD_MARKERS]
        if not content:
            continue
        i = rng.choice(content)
        wrong = list(example.target)
        wrong[i] = "X"
        step_number = body[:i].count(STEP_MARKER) + 1
        component = markers[next(t for t in reversed(body[:i]) if t in markers)]
        assert first_error(example.target, wrong, fmt) == (component, step_number), (task, fmt, i)
        checked += 1
    assert checked >= 3


def test_declared_components_match_the_gold_steps():
    for spec in TASKS.values():
        problem = spec.make(random.Random(0), spec.train_lengths[-1])
        assert {name for s in problem.steps for name in s} == set(spec.components), spec.name


def test_addition_full_scratchpad_by_hand():
    rendered = render_scratchpad(addition_steps(number(357), number(48)), number(405), "full")
    assert " ".join(rendered) == (
        "<in> 7 , 8 <comp> 7 + 8 + 0 = 1 5 <out> 5 <vars> carry = 1 <rem> 3 5 + 4 <step> "
        "<in> 5 , 4 <comp> 5 + 4 + 1 = 1 0 <out> 0 <vars> carry = 1 <rem> 3 + <step> "
        "<in> 3 , 0 <comp> 3 + 0 + 1 = 4 <out> 4 <vars> carry = 0 <rem> + <ans> 4 0 5"
    )
    minimal = render_scratchpad(addition_steps(number(357), number(48)), number(405), "minimal")
    assert " ".join(minimal).startswith("<comp> 7 + 8 + 0 = 1 5 <out> 5 <step> <comp> 5 + 4 + 1")


@pytest.mark.parametrize("task", ["addition", "polynomial", "sort", "summation", "parity", "lego"])
def test_gold_steps_lead_to_the_answer(task):
    for example in examples(task, per_length=2, scratchpad="full"):
        steps, answer = parse_scratchpad(example.target, "full")
        outputs = [s["step_output"] for s in steps]
        if task == "addition":
            digits = "".join(o[0] for o in reversed(outputs)).lstrip("0") or "0"
            assert "".join(answer).endswith(digits)
        elif task in {"polynomial", "summation"}:
            assert steps[-1]["intermediate_variables"] == ["sum", "=", *answer]
        elif task == "parity":
            assert answer == ["odd" if outputs[-1] == ["1"] else "even"]
        elif task == "sort":
            assert answer == [t for i, o in enumerate(outputs) for t in ([","] if i else []) + o]
        else:
            assert outputs[-1] == answer


# --- vocabulary, encoding, exact match -----------------------------------------------------------

@pytest.mark.parametrize("task", sorted(TASKS))
def test_vocabulary_covers_every_format_and_length(task):
    vocab, spec = Vocabulary.for_task(task), TASKS[task]
    assert vocab.tokens[:4] == (PAD, BOS, EOS, SEP) and vocab.pad_id == 0
    assert list(vocab.tokens[11:]) == sorted(vocab.tokens[11:])
    for fmt in spec.scratchpads:
        for length in (spec.train_lengths.start, spec.split_lengths("test")[-1]):
            vocab.encode(spec.generate(random.Random(length), length, fmt))


def test_encode_layout_and_loss_mask():
    vocab = Vocabulary.for_task("addition")
    example = get_task("addition").generate(random.Random(0), 3, "full")
    ids, mask = vocab.encode(example)
    assert vocab.decode(ids) == [BOS, *example.prompt, SEP, *example.target, EOS]
    assert mask == [0] * (len(example.prompt) + 2) + [1] * (len(example.target) + 1)
    assert vocab.encode_prompt(example) == ids[: len(example.prompt) + 2]
    assert vocab.decode(np.array(ids)) == vocab.decode(ids)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        vocab.token_id("JUMP")
    with pytest.raises(ValueError, match="ids must lie"):
        vocab.decode([len(vocab)])


def test_exact_match_on_hand_made_predictions():
    example = Example(prompt=["add", ":", "3", "5", "7", "+", "4", "8"],
                      target=["<comp>", "junk", ANSWER_MARKER, "4", "0", "5"], answer=["4", "0", "5"], length=3)
    assert exact_match(["4", "0", "5"], example)
    assert exact_match(["4", "0", "5", EOS, PAD, PAD], example)
    assert exact_match([BOS, *example.prompt, SEP, "<comp>", "wrong", "steps", ANSWER_MARKER, "4", "0", "5", EOS],
                       example)
    assert not exact_match(["4", "0", "6", EOS], example)
    assert not exact_match(["4", "0", EOS, "5"], example)
    assert not exact_match(["4", "0", "5", "5"], example)
    assert not exact_match([ANSWER_MARKER, "4", "0", "5", ANSWER_MARKER, "4", "0"], example)
    assert parse_answer(["<out>", "1", ANSWER_MARKER, "7"]) == ["7"]


# --- errors --------------------------------------------------------------------------------------

def test_error_messages():
    with pytest.raises(ValueError, match="unknown task 'nope'.*known tasks: copy_repeat, "):
        make_split("nope", "train", 1, 0)
    with pytest.raises(ValueError, match="test_max_len=20 must exceed train_max_len=20"):
        make_split("copy", "test", 1, 0, test_max_len=20)
    with pytest.raises(ValueError, match="test_max_len=12 must exceed train_max_len=15"):
        make_split("copy", "test", 1, 0, train_max_len=15, test_max_len=12)
    with pytest.raises(ValueError, match="does not support scratchpad 'full'; supported: none$"):
        make_split("copy", "train", 1, 0, scratchpad="full")
    with pytest.raises(ValueError, match="supported: none, full, minimal, full_minus_step_input, "):
        make_split("lego", "train", 1, 0, scratchpad="full_minus_intermediate_variables")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        make_split("copy", "dev", 1, 0)
    with pytest.raises(ValueError, match="n=-1"):
        make_split("copy", "train", -1, 0)
    with pytest.raises(ValueError, match="below lego's shortest training length 4; set train_max_len >= 4$"):
        make_split("lego", "train", 1, 0, train_max_len=3)
    with pytest.raises(ValueError, match="exceeds lego's maximum length 26; set test_max_len <= 26$"):
        make_split("lego", "test", 1, 0, test_max_len=30)
    with pytest.raises(ValueError, match="test_max_len=101 exceeds pcfg's maximum length 100; set test_max_len <= 100$"):
        make_split("pcfg", "test", 1, 0, test_max_len=101)
    with pytest.raises(ValueError, match="cannot generate length 29"):
        get_task("scan").generate(random.Random(0), 29)
    with pytest.raises(ValueError, match="unknown scratchpad format 'fancy'"):
        enabled_components("fancy")
    with pytest.raises(ValueError, match="unknown scratchpad components"):
        step(step_thoughts=["x"])


@pytest.mark.parametrize(("tokens", "message"), [
    (["<comp>", "1", "<out>", "1"], "no <ans>"),
    (["1", "<comp>", "1", ANSWER_MARKER, "1"], "must start with a component marker"),
    (["<out>", "1", "<comp>", "1", ANSWER_MARKER, "1"], "out of order"),
    (["<in>", "1", ANSWER_MARKER, "1"], "not part of this scratchpad format"),
])
def test_parse_scratchpad_rejects_malformed_targets(tokens, message):
    with pytest.raises(ValueError, match=message):
        parse_scratchpad(tokens, "minimal")


@pytest.mark.parametrize("program", [["append", "A1"], ["reverse"], ["A1", ","], [","]])
def test_pcfg_rejects_malformed_programs(program):
    with pytest.raises(ValueError):
        interpret(program)


def test_components_use_the_paper_names():
    assert COMPONENTS == ("step_input", "step_computation", "step_output", "intermediate_variables",
                          "remaining_input")
