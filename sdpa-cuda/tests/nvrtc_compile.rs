//! Every kernel module compiles with NVRTC for sm_80 and sm_90 (and for sm_90a, the target a module marked
//! `arch_specific` gets on an sm_90 device), with no GPU needed: a syntax error in a `.cu` file fails here
//! (CI installs the pinned NVRTC and CUDA header wheels and sets `SDPA_REQUIRE_NVRTC=1`, so a missing NVRTC
//! fails instead of skipping).

use sdpa_cuda::{libs, modules, nvrtc};

#[test]
fn every_module_compiles_for_sm80_and_sm90() {
    let required = std::env::var_os("SDPA_REQUIRE_NVRTC").is_some_and(|v| v == "1");
    let version = match nvrtc::version() {
        Ok(v) => v,
        Err(e) if !required => {
            eprintln!("skipping: {e}");
            return;
        }
        Err(e) => panic!("SDPA_REQUIRE_NVRTC=1 but {e}"),
    };
    let include = libs::include_dir();
    let Some(include) = include else {
        assert!(!required, "SDPA_REQUIRE_NVRTC=1 but no CUDA include dir (cuda_fp16.h) was found");
        eprintln!("skipping: NVRTC {version:?} found but no CUDA headers");
        return;
    };
    let inc = include.display().to_string();
    eprintln!("NVRTC {version:?}, headers from {inc}");
    let mut failures = Vec::new();
    for module in modules::MODULES {
        let specific = module.arch_specific.then(|| module.arch_for("sm_90"));
        for arch in ["sm_80", "sm_90"].into_iter().chain(specific.as_deref()) {
            let opts = nvrtc::options(arch, Some(&inc), module);
            let t = std::time::Instant::now();
            match nvrtc::compile(module, arch, &opts) {
                Ok(c) => {
                    eprintln!("{:>10} {arch}: {} bytes in {:.2?}", module.name, c.cubin.len(), t.elapsed());
                    if !c.log.is_empty() {
                        eprintln!("{}", c.log);
                    }
                    assert!(c.cubin.len() > 1000, "{} {arch}: suspiciously small cubin", module.name);
                }
                Err(e) => failures.push(format!("{e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_syntax_error_keeps_the_compiler_log() {
    if nvrtc::version().is_err() || libs::include_dir().is_none() {
        eprintln!("skipping: NVRTC or CUDA headers not found");
        return;
    }
    let broken = modules::ModuleSource::new("broken", "extern \"C\" __global__ void k() { int x = ; }");
    let inc = libs::include_dir().map(|p| p.display().to_string());
    let opts = nvrtc::options("sm_90", inc.as_deref(), &broken);
    let err = nvrtc::compile(&broken, "sm_90", &opts).expect_err("must not compile");
    let text = err.to_string();
    assert!(text.contains("broken.cu") && text.contains("expected an expression"), "{text}");
}
