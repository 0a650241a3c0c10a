"""A fixed generator of random JSON schemas for structured-output tests and benches: objects with
required and optional properties, arrays, enums, const, strings, numbers, integers, booleans, null,
anyOf and nesting. Bounded (string lengths, array sizes, number ranges) so that an output can end
within a reply's max_tokens whatever the model prefers."""
import random

WORDS = ["id", "name", "size", "ok", "tags", "kind", "items", "score", "next", "note", "when", "count"]


def _scalar(rng):
    t = rng.choice(["string", "integer", "number", "boolean", "null", "enum", "const", "string_enum"])
    if t == "string":
        return {"type": "string", "maxLength": rng.randint(1, 8)}
    if t == "integer":
        lo = rng.randint(-100, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 500)}
    if t == "number":
        return {"type": "number", "minimum": -10, "maximum": 10}
    if t == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2.5, True, None], rng.randint(1, 4))}
    if t == "const":
        return {"const": rng.choice(["fixed", 7, False])}
    if t == "string_enum":
        return {"type": "string", "enum": rng.sample(["a", "bb", "ccc", "dd d"], rng.randint(1, 3))}
    return {"type": t}


def _schema(rng, depth):
    r = rng.random()
    if depth >= 3 or r < 0.45:
        return _scalar(rng)
    if r < 0.65:
        return {"type": "array", "items": _schema(rng, depth + 1), "minItems": rng.randint(0, 1),
                "maxItems": rng.randint(1, 3)}
    if r < 0.75:
        return {"anyOf": [_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    return _object(rng, depth + 1)


def _object(rng, depth):
    names = rng.sample(WORDS, rng.randint(1, 4))
    props = {n: _schema(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.7]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def schemas(n, seed=41):
    """n schemas, the same ones for the same seed; each has an object at its root (as OpenAI asks)."""
    rng = random.Random(seed)
    return [_object(rng, 0) for _ in range(n)]
