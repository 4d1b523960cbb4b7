# The PyTorch reference (bench/pytorch_reference.py) on the CPU: single, dp, and ddp and zero1 under torchrun
# over gloo; its run records against docs/metrics.md, and ddp/zero1 against single; its GPT path against
# ptrain's own training of the same tiny GPT (the executable passed as the argument).
# Two torchrun launches of two processes each dominate the time (about a minute on two cores).
add_test(NAME pytorch_reference
         COMMAND ${PTRAIN_ORACLE_PYTHON} ${PROJECT_SOURCE_DIR}/tests/bench/pytorch_reference_test.py
                 $<TARGET_FILE:ptrain_app>)
set_tests_properties(pytorch_reference PROPERTIES TIMEOUT 300 LABELS "bench;slow" COST 60
                     ENVIRONMENT "${PTRAIN_TEST_ENVIRONMENT}")
