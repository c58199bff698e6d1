"""Checks Schemathesis runs on Airlock besides its own (loaded by schemathesis.toml).

Schemathesis' `positive_data_acceptance` takes statuses, not error codes. Some requests that
match the schema are still refused for reasons no schema can state: a cursor Airlock did not
issue (400 `invalid_cursor`), a confirmation token that does not verify (422), a plan already
executed or expired (422), an `Idempotency-Key` header that differs from the body's key (400).
schemathesis.toml lets 400 and 422 through that check; `semantic_refusals_only` takes them
back: a schema-valid request may be refused with 400 or 422 only with one of the codes below,
so a field the server rejects but the schema allows still fails the run.

`every_operation_succeeds` fails the run if an operation never answered 2xx: a fuzzer that
only ever hits the front door (401, 404) proves little.
"""

import schemathesis

# Codes a schema-valid request may get with 400 or 422, per operation id.
SEMANTIC = {
    "listAccounts": {"invalid_cursor"},
    "listPositions": {"invalid_cursor"},
    "listOrders": {"invalid_cursor"},
    "listJobs": {"invalid_cursor"},
    "executePlan": {
        "token_invalid",
        "token_expired",
        "plan_expired",
        "plan_not_executable",
        "idempotency_key_reused",
        "policy_violation",
        "plan_declined",
    },
}


def _operation_id(case):
    return case.operation.definition.raw.get("operationId")


def _is_positive(case):
    meta = case.meta
    return meta is not None and meta.generation.mode.is_positive


@schemathesis.check
def semantic_refusals_only(ctx, response, case):
    if response.status_code not in (400, 422) or not _is_positive(case):
        return None
    try:
        body = response.json()
        code = body["error"]["code"]
        details = body["error"].get("details") or []
    except Exception as exc:  # the conformance checks report a malformed body
        raise AssertionError(f"error body without a code: {exc}")
    op = _operation_id(case)
    if code in SEMANTIC.get(op, set()):
        return None
    # The one 400 a schema cannot foresee: the header key and the body key differ.
    if (
        op == "executePlan"
        and code == "invalid_request"
        and [d.get("field") for d in details] == ["/idempotency_key"]
        and case.headers
        and "Idempotency-Key" in case.headers
        and isinstance(case.body, dict)
        and case.headers["Idempotency-Key"] != case.body.get("idempotency_key")
    ):
        return None
    raise AssertionError(
        f"A schema-valid request was refused with {response.status_code} `{code}` "
        f"({details}); the schema should refuse it too, or the server accept it"
    )


@schemathesis.check
class every_operation_succeeds:
    def __init__(self):
        self.tested = set()
        self.succeeded = set()

    def after_response(self, ctx, response, case):
        op = _operation_id(case)
        self.tested.add(op)
        if 200 <= response.status_code < 300:
            self.succeeded.add(op)

    def after_run(self, ctx):
        never = sorted(op for op in self.tested - self.succeeded if op)
        if never:
            raise AssertionError(f"operations that never answered 2xx: {never}")
