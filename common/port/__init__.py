"""The porting assistant: ``zoo port check PATH`` (common/port/check.py), ``zoo port migrate``,
``zoo port vendor-check``.

    source.py        a user's file parsed once: names resolved through its imports
    static.py        the reader: regions (model, data, training step, host) and rule tables
    params_reads.py  the params keys a folder's code reads
    folder.py        a zoo folder's contract pieces and configs
    capture.py       the built model through the device compiler (device/api.py)
    script.py        a plain script's model built without running the script
    findings.py      findings in fix order, notes, exit statuses
    check.py         the command: read, build, order, print
    migrate.py       ``zoo port migrate SRC --out DEST``: a vendor folder copied, its imports rewritten
    vendor_folders.py the vendor's nine PyTorch transformers folders: data command, small overrides
    vendor_check.py  ``zoo port vendor-check CHECKOUT``: each of them migrated, prepared, run, compared
"""
