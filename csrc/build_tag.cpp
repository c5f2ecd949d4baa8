// A marker string in the binary naming the torch version _C was compiled
// against. softmax_ext/_compat.py reads it from the file when _C fails to
// load (a torch of another version usually leaves symbols undefined), so the
// import error can name both versions even though no op could register.

#define SOFTMAX_EXT_TAG_STR2(x) #x
#define SOFTMAX_EXT_TAG_STR(x) SOFTMAX_EXT_TAG_STR2(x)

extern "C" {
__attribute__((used, visibility("default"))) const char softmax_ext_built_against_torch[] =
    "softmax_ext built against torch " SOFTMAX_EXT_TAG_STR(SOFTMAX_EXT_TORCH_VERSION) ";";
}
