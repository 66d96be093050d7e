"""The local stack delivers as concurrently as infra/ deploys: tpujobs.local.function_scale is
functions.tf's `max` and `concurrent` of every function, and those are what the function gets."""

from __future__ import annotations

from terraform_config import Terraform, block

from tpujobs.local.function_scale import SCALES


def test_the_local_scale_of_each_function_is_infras(tf: Terraform) -> None:
    """Max instances and requests per instance, function by function, as functions.tf declares them."""
    functions = tf.locals["functions"]
    assert {target: (f["max"], f["concurrent"]) for target, f in functions.items()} == {
        target: (scale.max_instances, scale.concurrency) for target, scale in SCALES.items()
    }


def test_the_function_is_deployed_with_those_numbers(tf: Terraform) -> None:
    """functions.tf's table is what each function's service config uses (a deployment's
    var.max_instances overrides `max` per function; none by default), with a thread per request."""
    service = block(tf.resource("google_cloudfunctions2_function", "function"), "service_config")
    assert service["max_instance_count"] == "${lookup(var.max_instances, each.key, each.value.max)}"
    assert service["max_instance_request_concurrency"] == "${each.value.concurrent}"
    assert tf.variables["max_instances"]["default"] == {}
    assert "THREADS = tostring(each.value.concurrent)" in tf.text
