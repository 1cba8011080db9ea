/* A program built against an installed cacheblend, as an application would
 * be (find_package or pkg-config): checks that the header and the library it
 * links are the expected version, loads the model and checks its layer
 * count.
 *   consumer MODEL EXPECTED_VERSION EXPECTED_N_LAYER
 * EXPECTED_N_LAYER 0 means "not known": any positive count passes.  Prints
 * "n_layer N"; exit status 0 only when everything matched. */
#include <cacheblend/cacheblend.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  cb_model* model = NULL;
  cb_model_info info;
  cb_status status;
  long expected_layers;
  if (argc != 4) {
    fprintf(stderr, "usage: %s MODEL EXPECTED_VERSION EXPECTED_N_LAYER\n", argv[0]);
    return 2;
  }
  expected_layers = strtol(argv[3], NULL, 10);
  printf("library %s, header %s\n", cb_version(), CB_VERSION_STRING);
  if (strcmp(cb_version(), argv[2]) != 0 || strcmp(CB_VERSION_STRING, argv[2]) != 0 ||
      cb_version_number() != CB_VERSION_NUMBER) {
    fprintf(stderr, "version mismatch: expected %s\n", argv[2]);
    return 1;
  }
  status = cb_model_load(argv[1], NULL, &model);
  if (status != CB_OK) {
    fprintf(stderr, "cb_model_load: %s: %s\n", cb_status_string(status), cb_last_error());
    return 1;
  }
  cb_model_info_init(&info);
  status = cb_model_get_info(model, &info);
  cb_model_free(model);
  if (status != CB_OK) {
    fprintf(stderr, "cb_model_get_info: %s: %s\n", cb_status_string(status), cb_last_error());
    return 1;
  }
  printf("n_layer %d\n", (int)info.n_layer);
  if (info.n_layer <= 0 || (expected_layers > 0 && info.n_layer != expected_layers)) {
    fprintf(stderr, "n_layer %d, expected %ld\n", (int)info.n_layer, expected_layers);
    return 1;
  }
  return 0;
}
