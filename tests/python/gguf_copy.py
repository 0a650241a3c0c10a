"""Shared by the GGUF tests that edit a fixture (test_gguf_convert.py, test_gguf_lattice_types.py):
a copy of a GGUF file written by the `gguf` package, every metadata key kept and each tensor
either kept or replaced."""


def copy_gguf(gguf, src, dst, replace):
    """Writes dst from src; replace(tensor) returns None to keep the tensor as stored, or
    (array, raw_dtype) to write instead (raw_dtype None: a float array written as its dtype)."""
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch=r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), f.types[0], sub)
    for t in r.tensors:
        new = replace(t)
        if new is None:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        else:
            w.add_tensor(t.name, new[0], raw_dtype=new[1])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
