# Pinned versions of the Python oracles and the llama.cpp peer (sourced by
# scripts/oracle_venv.sh, scripts/regen_goldens.sh, scripts/build_llamacpp_peer.sh).
# Change a pin here, then re-run the scripts: they converge to these versions.
CB_PIN_NUMPY="2.4.6"
CB_PIN_GGUF="0.19.0"
CB_PIN_LLAMA_CPP_PYTHON="0.3.36"
# The llama.cpp commit vendored by that llama-cpp-python sdist (its CHANGELOG);
# the sdist has no .git, so it is passed to llama.cpp's build-info explicitly.
CB_PIN_LLAMA_CPP_COMMIT="0c1e57098"
