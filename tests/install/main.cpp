// Uses retort as an outside project would: the installed header and library, found through pkg-config.
#include <retort/retort.h>

#include <cstdio>

int main() {
  retort::Context ctx(retort::default_cpu_backend());
  retort::Tensor* a = ctx.input(retort::DType::F32, {2, 3}, "a");
  retort::Tensor* b = ctx.input(retort::DType::F32, {2, 3}, "b");
  retort::set_data(a, {1, 2, 3, 4, 5, 6});
  retort::set_data(b, {10, 20, 30, 40, 50, 60});
  retort::Tensor* c = retort::add(ctx, a, b);
  c->flags |= retort::kOutput;
  retort::Graph graph(ctx);
  graph.forward(c);
  graph.compute();
  for (float v : retort::get_data(c)) std::printf("%g ", v);
  std::printf("\n");
  return 0;
}
