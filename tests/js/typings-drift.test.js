// npm/index.d.ts (hand-written) against the declarations wasm-bindgen generates for the module
// (target/npm/glue-types/distopt_wasm.d.ts, written by scripts/build-npm.sh): every class and
// function the module exports is declared, with the same members (methods, getters, static
// methods), the same number of parameters and the same promise-returning calls, and the typings
// declare nothing the module lacks. A changed signature on either side fails here, naming it.
//
// The generated declarations type every JsValue as `any`, so the hand-written file stays the
// place for the real types; what this pins is the shape that both must share.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import ts from 'typescript';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../..');
const GLUE = path.join(ROOT, 'target/npm/glue-types/distopt_wasm.d.ts');
const TYPINGS = path.join(ROOT, 'npm/index.d.ts');

/** Exports of the module that index.js keeps to itself or replaces (not part of the API). */
const GLUE_ONLY = new Set([
  'initSync', // index.js's init() loads the module
  'start', // wasm-bindgen's start function, run by init
  'threadStartData', // the threaded build's worker start (index.js, threads/worker.js)
  'threadWorkers',
  '__distoptDestroyDeviceForTest', // test hooks (node-gpu, browser-threads)
  '__distoptPanicOnWorkerForTest',
]);
/** Exports index.js adds in JavaScript (loading, and classes the module does not have). */
const TYPINGS_ONLY = new Set(['init', 'default']);
/** Members every class has that are the glue's or the guard's bookkeeping. */
const SKIPPED_MEMBER = (name) => name === 'free' || name.startsWith('__') || name.startsWith('[');

/**
 * The exported classes and functions of `file`, each as a comparable shape:
 * `{kind: 'class', ctor, members: Map(name -> shape), statics}` or `{kind: 'function', params, promise}`.
 */
function shapes(file, program) {
  const checker = program.getTypeChecker();
  const source = program.getSourceFile(file);
  const moduleSymbol = checker.getSymbolAtLocation(source);
  const out = new Map();
  const signatureShape = (signatures) => ({
    params: Math.max(...signatures.map((s) => s.getParameters().length)),
    promise: signatures.some((s) => {
      const ret = checker.getReturnTypeOfSignature(s);
      return ret.getSymbol()?.getName() === 'Promise';
    }),
  });
  const memberShapes = (type) => {
    const members = new Map();
    for (const prop of checker.getPropertiesOfType(type)) {
      const name = prop.getName();
      if (SKIPPED_MEMBER(name) || name === 'prototype') continue;
      const decl = prop.valueDeclaration ?? prop.declarations?.[0];
      const propType = checker.getTypeOfSymbolAtLocation(prop, decl ?? source);
      const calls = propType.getCallSignatures();
      const isMethod = decl && (ts.isMethodDeclaration(decl) || ts.isMethodSignature(decl));
      members.set(name, isMethod && calls.length ? { kind: 'method', ...signatureShape(calls) } : { kind: 'property' });
    }
    return members;
  };
  for (const exported of checker.getExportsOfModule(moduleSymbol)) {
    const symbol = exported.flags & ts.SymbolFlags.Alias ? checker.getAliasedSymbol(exported) : exported;
    const name = exported.getName();
    if (symbol.flags & ts.SymbolFlags.Class) {
      const instance = checker.getDeclaredTypeOfSymbol(symbol);
      const staticType = checker.getTypeOfSymbolAtLocation(symbol, symbol.valueDeclaration);
      const ctors = staticType.getConstructSignatures();
      out.set(name, {
        kind: 'class',
        ctor: ctors.length ? signatureShape(ctors).params : null,
        members: memberShapes(instance),
        statics: memberShapes(staticType),
      });
    } else if (symbol.flags & ts.SymbolFlags.Function) {
      const type = checker.getTypeOfSymbolAtLocation(symbol, symbol.valueDeclaration);
      out.set(name, { kind: 'function', ...signatureShape(type.getCallSignatures()) });
    }
  }
  return out;
}

/** Every difference between the glue's shapes and the typings', as readable lines. */
function drift(glue, typings) {
  const problems = [];
  for (const [name, g] of glue) {
    if (GLUE_ONLY.has(name)) continue;
    const t = typings.get(name);
    if (!t) {
      problems.push(`${name}: the module exports this ${g.kind}; index.d.ts does not declare it`);
      continue;
    }
    if (t.kind !== g.kind) {
      problems.push(`${name}: a ${g.kind} in the module, a ${t.kind} in index.d.ts`);
      continue;
    }
    if (g.kind === 'function') {
      if (g.params !== t.params) problems.push(`${name}(): ${g.params} parameters in the module, ${t.params} in index.d.ts`);
      if (g.promise !== t.promise) problems.push(`${name}(): ${g.promise ? '' : 'no '}promise from the module, ${t.promise ? '' : 'no '}promise in index.d.ts`);
      continue;
    }
    if (g.ctor !== t.ctor) {
      problems.push(`new ${name}(): ${g.ctor ?? 'no'} constructor parameters in the module, ${t.ctor ?? 'no'} in index.d.ts`);
    }
    for (const [side, gm, tm] of [['', g.members, t.members], ['static ', g.statics, t.statics]]) {
      for (const [member, gs] of gm) {
        const ts_ = tm.get(member);
        const what = `${side}${name}.${member}`;
        if (!ts_) {
          problems.push(`${what}: in the module, not in index.d.ts`);
        } else if (gs.kind !== ts_.kind) {
          problems.push(`${what}: a ${gs.kind} in the module, a ${ts_.kind} in index.d.ts`);
        } else if (gs.kind === 'method') {
          if (gs.params !== ts_.params) problems.push(`${what}(): ${gs.params} parameters in the module, ${ts_.params} in index.d.ts`);
          if (gs.promise !== ts_.promise) problems.push(`${what}(): ${gs.promise ? 'a' : 'no'} promise from the module, ${ts_.promise ? 'a' : 'no'} promise in index.d.ts`);
        }
      }
      for (const member of tm.keys()) {
        if (!gm.has(member)) problems.push(`${side}${name}.${member}: in index.d.ts, not in the module`);
      }
    }
  }
  for (const [name, t] of typings) {
    if (!glue.has(name) && !TYPINGS_ONLY.has(name)) problems.push(`${name}: index.d.ts declares this ${t.kind}; the module does not export it`);
  }
  return problems;
}

function program(files) {
  return ts.createProgram(files, { strict: true, noEmit: true, target: ts.ScriptTarget.ES2022, lib: ['lib.es2022.d.ts', 'lib.dom.d.ts'] });
}

test('index.d.ts declares exactly the classes, members, parameter counts and promises of the module', () => {
  assert.ok(fs.existsSync(GLUE), `${GLUE} is missing: run scripts/build-npm.sh first`);
  const p = program([GLUE, TYPINGS]);
  const glue = shapes(GLUE, p);
  const problems = drift(glue, shapes(TYPINGS, p));
  assert.deepEqual(problems, [], `index.d.ts has drifted from the module:\n${problems.join('\n')}`);
  // What was compared (so that a reader of the log sees the check is not vacuous).
  const classes = [...glue.values()].filter((g) => g.kind === 'class');
  const members = classes.reduce((n, c) => n + c.members.size + c.statics.size, 0);
  assert.ok(classes.length >= 19 && members >= 120, `only ${classes.length} classes, ${members} members compared`);
  console.log(`typings-drift: ${classes.length} classes, ${members} members, ${glue.size - classes.length} functions compared`);
});

test('the drift check fails on a changed signature, a missing member and a lost promise', () => {
  const dir = fs.mkdtempSync(path.join(fs.realpathSync(process.env.TMPDIR ?? '/tmp'), 'distopt-drift-'));
  try {
    let changed = fs.readFileSync(TYPINGS, 'utf8');
    const edits = [
      // One parameter fewer on a method.
      ['loadStateDict(rank: number, stateDict: StateDictInput): void;', 'loadStateDict(rank: number): void;'],
      // A function the module does not have (and one it has, undeclared).
      ['export function sgdStep(', 'export function sgdStepGone('],
      // A promise that is not one (the local optimizers' stateDict, declared once for all three).
      ['  stateDict(rank: number): Promise<StateDict>;', '  stateDict(rank: number): StateDict;'],
    ];
    for (const [from, to] of edits) {
      assert.ok(changed.includes(from), `the test's edit no longer applies: ${from}`);
      changed = changed.replace(from, to);
    }
    const file = path.join(dir, 'index.d.ts');
    fs.writeFileSync(file, changed);
    const p = program([GLUE, file]);
    const problems = drift(shapes(GLUE, p), shapes(file, p));
    assert.ok(problems.some((l) => /loadStateDict\(\): 2 parameters in the module, 1 in index\.d\.ts/.test(l)), problems.join('\n'));
    assert.ok(problems.some((l) => /^sgdStep: the module exports this function; index\.d\.ts does not declare it/.test(l)), problems.join('\n'));
    assert.ok(problems.some((l) => /^sgdStepGone: index\.d\.ts declares this function; the module does not export it/.test(l)), problems.join('\n'));
    assert.ok(problems.some((l) => /^SGD\.stateDict\(\): a promise from the module, no promise in index\.d\.ts/.test(l)), problems.join('\n'));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
