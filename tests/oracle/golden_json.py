"""The golden files' JSON layout: one line per field of each list entry, so that
diffs stay readable and id lists compact."""
import json


def dump(doc: dict) -> str:
    """JSON with one line per field of each list entry (readable diffs, compact id lists)."""
    def c(v):
        return json.dumps(v, ensure_ascii=False)
    out = ["{"]
    keys = list(doc)
    for i, k in enumerate(keys):
        v = doc[k]
        sep = "," if i < len(keys) - 1 else ""
        if isinstance(v, list):
            out.append(f" {c(k)}: [")
            for j, e in enumerate(v):
                fields = ",\n".join(f"   {c(fk)}: {c(fv)}" for fk, fv in e.items())
                out.append("  {\n" + fields + "\n  }" + ("," if j < len(v) - 1 else ""))
            out.append(" ]" + sep)
        elif isinstance(v, dict):
            fields = ",\n".join(f"  {c(fk)}: {c(fv)}" for fk, fv in v.items())
            out.append(f" {c(k)}: {{\n{fields}\n }}{sep}")
        else:
            out.append(f" {c(k)}: {c(v)}{sep}")
    out.append("}")
    text = "\n".join(out) + "\n"
    assert json.loads(text) == doc
    return text
