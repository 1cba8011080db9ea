# Python oracles, included by tests/CMakeLists.txt.
#
#   oracle_reference_logits  float64 NumPy reference forward pass (tests/oracle/
#                            reference_forward.py) over tests/golden/reference_prompts.json
#                            into ${CMAKE_BINARY_DIR}/oracle/reference; fixture
#                            `reference_logits` for the C++ tests that compare against it.
#   oracle_gemma3_reference  the same for Gemma 3 270M (models/gemma-3-270m-q4_k_m.gguf) over
#                            tests/golden/reference_prompts_gemma3.json into
#                            ${CMAKE_BINARY_DIR}/oracle/gemma3; also fixture `reference_logits`.
#   oracle_qwen05_reference  the same for Qwen2.5-Coder 0.5B Instruct (models/qwen2.5-coder-0.5b-
#                            instruct-q4_k_m.gguf) over tests/golden/reference_prompts_qwen2_0.5b.json
#                            into ${CMAKE_BINARY_DIR}/oracle/qwen2_0.5b; also fixture
#                            `reference_logits` (~40 s on 2 cores, ~4.3 GB of memory, when not cached).
#   oracle_golden_fresh      tests/golden/llamacpp.json was generated from the model in use
#                            (and llamacpp_gemma3.json from Gemma 3 270M, llamacpp_qwen2_0.5b.json
#                            from Qwen2.5-Coder 0.5B).
#   oracle_arch_reference    a random-weight GGUF per architecture (tests/oracle/
#                            write_random_gguf.py) and its float64 reference logits into
#                            ${CMAKE_BINARY_DIR}/oracle/arch; also fixture `reference_logits`.
#
# The oracle venv (numpy + gguf, pinned) lives in ${CB_CACHE_DIR:-~/.cache/cacheblend-rt}/venv,
# created by scripts/oracle_venv.sh on first use.  llama-cpp-python is not needed here: the
# llama.cpp goldens are committed files (scripts/regen_goldens.sh regenerates them).
# CB_MODEL in the test environment overrides the model, as everywhere.

find_program(CB_BASH bash)
find_package(Python3 COMPONENTS Interpreter)
set(CB_ORACLE_DIR ${PROJECT_SOURCE_DIR}/tests/oracle)
set(CB_GOLDEN_DIR ${PROJECT_SOURCE_DIR}/tests/golden)
set(CB_REFERENCE_DIR ${CMAKE_BINARY_DIR}/oracle/reference)

if(CB_BASH)
  add_test(NAME oracle_reference_logits
           COMMAND ${CB_BASH} ${CB_ORACLE_DIR}/run_reference.sh ${CB_DEFAULT_MODEL} ${CB_REFERENCE_DIR})
  set_tests_properties(oracle_reference_logits PROPERTIES
    FIXTURES_SETUP reference_logits
    LABELS oracle
    TIMEOUT 900)
  add_test(NAME oracle_gemma3_reference
           COMMAND ${CB_BASH} ${CB_ORACLE_DIR}/run_reference.sh ${CB_GEMMA3_MODEL}
                   ${CMAKE_BINARY_DIR}/oracle/gemma3 ${CB_GOLDEN_DIR}/reference_prompts_gemma3.json)
  set_tests_properties(oracle_gemma3_reference PROPERTIES
    FIXTURES_SETUP reference_logits
    LABELS oracle
    TIMEOUT 900)
  add_test(NAME oracle_qwen05_reference
           COMMAND ${CB_BASH} ${CB_ORACLE_DIR}/run_reference.sh ${CB_QWEN05_MODEL}
                   ${CMAKE_BINARY_DIR}/oracle/qwen2_0.5b ${CB_GOLDEN_DIR}/reference_prompts_qwen2_0.5b.json)
  set_tests_properties(oracle_qwen05_reference PROPERTIES
    FIXTURES_SETUP reference_logits
    LABELS oracle
    TIMEOUT 900)
  add_test(NAME oracle_arch_reference
           COMMAND ${CB_BASH} ${CB_ORACLE_DIR}/run_arch_reference.sh ${CMAKE_BINARY_DIR}/oracle/arch)
  set_tests_properties(oracle_arch_reference PROPERTIES
    FIXTURES_SETUP reference_logits
    LABELS oracle
    TIMEOUT 600)
else()
  message(WARNING "bash not found: oracle_reference_logits is not defined")
endif()

if(Python3_Interpreter_FOUND)
  add_test(NAME oracle_golden_fresh
           COMMAND ${Python3_EXECUTABLE} ${CB_ORACLE_DIR}/check_golden_fresh.py ${CB_DEFAULT_MODEL}
                   ${CB_GOLDEN_DIR}/llamacpp.json ${CB_GOLDEN_DIR}/reference_prompts.json)
  set_tests_properties(oracle_golden_fresh PROPERTIES LABELS oracle TIMEOUT 120)
  add_test(NAME oracle_golden_fresh_gemma3
           COMMAND ${Python3_EXECUTABLE} ${CB_ORACLE_DIR}/check_golden_fresh.py ${CB_GEMMA3_MODEL}
                   ${CB_GOLDEN_DIR}/llamacpp_gemma3.json
                   ${CB_GOLDEN_DIR}/reference_prompts_gemma3.json --fixed-model)
  set_tests_properties(oracle_golden_fresh_gemma3 PROPERTIES LABELS oracle TIMEOUT 120)
  add_test(NAME oracle_golden_fresh_qwen05
           COMMAND ${Python3_EXECUTABLE} ${CB_ORACLE_DIR}/check_golden_fresh.py ${CB_QWEN05_MODEL}
                   ${CB_GOLDEN_DIR}/llamacpp_qwen2_0.5b.json
                   ${CB_GOLDEN_DIR}/reference_prompts_qwen2_0.5b.json --fixed-model)
  set_tests_properties(oracle_golden_fresh_qwen05 PROPERTIES LABELS oracle TIMEOUT 120)
endif()
