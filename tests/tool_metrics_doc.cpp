// Prints docs/metrics.md from the metrics schema (train/step_record.h: step_record_fields).
//   tool_metrics_doc                 the page on stdout (`build/tool_metrics_doc > docs/metrics.md`)
//   tool_metrics_doc --check FILE    exit 1 when FILE differs from it (ctest metrics_doc)
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "train/step_record.h"

int main(int argc, char** argv) {
  const std::string page = moe::train::metrics_doc_markdown();
  if (argc == 1) {
    std::fwrite(page.data(), 1, page.size(), stdout);
    return 0;
  }
  if (argc != 3 || std::strcmp(argv[1], "--check") != 0) {
    std::fprintf(stderr, "usage: tool_metrics_doc [--check docs/metrics.md]\n");
    return 2;
  }
  std::ifstream f(argv[2], std::ios::binary);
  std::stringstream have;
  have << f.rdbuf();
  if (f && have.str() == page) return 0;
  std::fprintf(stderr, "%s is stale (the metrics schema, src/train/step_record.cpp, changed): regenerate it with "
                       "build/tool_metrics_doc > docs/metrics.md\n",
               argv[2]);
  return 1;
}
