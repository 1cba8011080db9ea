// dlopen_host.c's C++ library: containers grown and rehashed, so memory
// from operator new is returned through operator delete (sized and not).
#include <string>
#include <unordered_map>
#include <vector>

extern "C" __attribute__((visibility("default"))) int cxx_probe_churn(int n) {
  std::unordered_map<int, std::string> m;
  std::vector<int*> v;
  for (int i = 0; i < n; ++i) {
    m.emplace(i, std::string(40, 'x'));
    v.push_back(new int(i));
  }
  for (int* p : v) delete p;
  return static_cast<int>(m.size());
}
