"""Schemathesis hooks for tests/tests/schemathesis.rs (loaded through SCHEMATHESIS_HOOKS).

`amountCents` is `type: integer`, and JSON Schema 2020-12 counts `4900.0` as an integer,
so schemathesis sends whole floats as valid data. The API refuses them on purpose
(docs/api.md: "`4900.0`, `1e3`, `"4900"` are refused"; openapi.yaml says so in the field's
description), which no JSON Schema keyword can express. The whole float is rewritten as
the integer it stands for; every other generated value, valid or not, goes out as is.
"""

import schemathesis


@schemathesis.hook
def map_body(context, body):
    if isinstance(body, dict):
        amount = body.get("amountCents")
        if isinstance(amount, float) and amount.is_integer():
            return {**body, "amountCents": int(amount)}
    return body
